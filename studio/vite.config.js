// The Studio page's build: fixed file names (no content hashes), so the bundle the binary
// embeds (`src/server/studio.rs`) is named in the Rust source and a rebuild from the same
// sources gives the same bytes (`.ci/run` checks it).
import { defineConfig } from "vite";
import preact from "@preact/preset-vite";

// `npm run dev` serves the page with hot reload and sends the API to a running server.
const api = process.env.RUNNER_URL || "http://127.0.0.1:2024";
const proxied = ["/assistants", "/threads", "/runs", "/runner", "/info", "/ok", "/store"];

export default defineConfig({
  base: "/studio/",
  plugins: [preact({ devToolsEnabled: false, prerender: { enabled: false } })],
  build: {
    outDir: "dist",
    emptyOutDir: true,
    sourcemap: false,
    modulePreload: { polyfill: false },
    reportCompressedSize: true,
    target: "es2022",
    rollupOptions: {
      output: {
        entryFileNames: "assets/studio.js",
        chunkFileNames: "assets/[name].js",
        assetFileNames: "assets/studio[extname]",
        inlineDynamicImports: true,
      },
    },
  },
  server: { proxy: Object.fromEntries(proxied.map((p) => [p, api])) },
});
