// Code blocks in answers, coloured by their language. highlight.js's core
// with the 21 languages overnight audits and drafts are mostly written in
// (107 kB more script, 35 kB gzipped, where all 190 would be about 900 kB);
// a block in another language, or with none named, stays plain rather than
// guessed at.

import hljs from "highlight.js/lib/core";
import bash from "highlight.js/lib/languages/bash";
import c from "highlight.js/lib/languages/c";
import cpp from "highlight.js/lib/languages/cpp";
import css from "highlight.js/lib/languages/css";
import diff from "highlight.js/lib/languages/diff";
import go from "highlight.js/lib/languages/go";
import ini from "highlight.js/lib/languages/ini";
import java from "highlight.js/lib/languages/java";
import javascript from "highlight.js/lib/languages/javascript";
import json from "highlight.js/lib/languages/json";
import kotlin from "highlight.js/lib/languages/kotlin";
import markdown from "highlight.js/lib/languages/markdown";
import python from "highlight.js/lib/languages/python";
import ruby from "highlight.js/lib/languages/ruby";
import rust from "highlight.js/lib/languages/rust";
import shell from "highlight.js/lib/languages/shell";
import sql from "highlight.js/lib/languages/sql";
import swift from "highlight.js/lib/languages/swift";
import typescript from "highlight.js/lib/languages/typescript";
import xml from "highlight.js/lib/languages/xml";
import yaml from "highlight.js/lib/languages/yaml";

const LANGUAGES = { bash, c, cpp, css, diff, go, ini, java, javascript, json, kotlin, markdown, python, ruby, rust, shell, sql, swift, typescript, xml, yaml };
for (const [name, lang] of Object.entries(LANGUAGES)) hljs.registerLanguage(name, lang);
// TOML reads well as INI.
hljs.registerAliases(["toml"], { languageName: "ini" });

/** Colours each `pre code` block of `out` that names a known language. */
export function highlightCode(out: Element): void {
  out.querySelectorAll("pre code[class*='language-']").forEach((el) => {
    const code = el as HTMLElement;
    if (code.dataset.highlighted) return;
    const lang = [...code.classList].find((k) => k.startsWith("language-"))?.slice("language-".length) ?? "";
    if (!hljs.getLanguage(lang)) return;
    hljs.highlightElement(code);
  });
}
