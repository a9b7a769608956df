import { defineConfig } from "vite";

// The UI is served by `longhaul serve` (and the desktop shell) from `dist/`.
export default defineConfig({
  base: "/",
  build: { outDir: "dist", emptyOutDir: true, sourcemap: false },
});
