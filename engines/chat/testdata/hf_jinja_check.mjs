// Renders the contexts golden.py --contexts wrote with @huggingface/jinja
// (as transformers.js renders chat templates) and lists the cases where it
// differs from Python's Jinja2, which vLLM runs. Run from the repository
// root:
//
//   python3 engines/chat/testdata/golden.py --contexts /tmp/contexts.json
//   node engines/chat/testdata/hf_jinja_check.mjs /tmp/contexts.json
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(new URL("../../../tests/tokref/package.json", import.meta.url));
const { Template } = require("@huggingface/jinja");

const cases = JSON.parse(readFileSync(process.argv[2], "utf8"));
let same = 0;
for (const c of cases) {
  let got;
  try {
    got = new Template(c.template).render(c.context);
  } catch (e) {
    got = `error: ${e.message}`;
  }
  if (got === c.want) {
    same++;
    continue;
  }
  let at = 0;
  while (at < got.length && got[at] === c.want[at]) at++;
  console.log(`${c.model}/${c.name}: differs at ${at}:\n  hf:     ${JSON.stringify(got.slice(at, at + 60))}\n  python: ${JSON.stringify(c.want.slice(at, at + 60))}`);
}
console.log(`${same} of ${cases.length} cases render as Python's Jinja2 does`);
