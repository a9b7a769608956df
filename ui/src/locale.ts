// Imported before anything else: a process started with LANG=C gives the
// page the language tag "C", which Intl refuses, and uPlot formats numbers
// with Intl as soon as it loads. Such a page falls back to English.

try {
  new Intl.NumberFormat(navigator.language);
} catch {
  Object.defineProperty(Navigator.prototype, "language", { get: () => "en-US", configurable: true });
  Object.defineProperty(Navigator.prototype, "languages", { get: () => ["en-US"], configurable: true });
}

export {};
