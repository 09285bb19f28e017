// Parse TeX formulas with the KaTeX vendored in docs/assets/katex (the one the site uses).
// stdin: JSON list of {"where": "file:line", "tex": "..."}; stdout: JSON list of
// {"where", "tex", "error"} for every formula KaTeX rejects (throwOnError, strict errors).
// Exit code 0 when every formula parses, 1 otherwise.
"use strict";
const path = require("path");
const katex = require(path.join(__dirname, "..", "docs", "assets", "katex", "katex.min.js"));

let input = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => (input += chunk));
process.stdin.on("end", () => {
  const failures = [];
  for (const item of JSON.parse(input)) {
    try {
      katex.renderToString(item.tex, { displayMode: true, throwOnError: true, strict: "error" });
    } catch (e) {
      failures.push({ where: item.where, tex: item.tex, error: String(e.message || e) });
    }
  }
  process.stdout.write(JSON.stringify(failures, null, 1) + "\n");
  process.exit(failures.length ? 1 : 0);
});
