// Hugging Face's tokenizers (the Rust library through its Node binding) timed
// on one text, for tandem-tokenizer-bench to set beside tandem's own time:
// the tokenizer is loaded and warmed up untimed, then each round times one
// encode of the whole text (what a caller of the binding waits for).
//   node tokenizer_bench.mjs tokenizer.json text.txt rounds ids.json
// Prints {"seconds": [...], "tokens": N} and writes the ids to ids.json.
import { readFileSync, writeFileSync } from 'node:fs';
import { Tokenizer } from 'tokenizers';

const [tokenizerPath, textPath, rounds, idsPath] = process.argv.slice(2);
const tokenizer = Tokenizer.fromFile(tokenizerPath);
const text = readFileSync(textPath, 'utf8');
await tokenizer.encode(text.slice(0, 4096), null, { addSpecialTokens: false });
const seconds = [];
let ids = [];
for (let r = 0; r < Number(rounds); ++r) {
  const start = process.hrtime.bigint();
  const encoding = await tokenizer.encode(text, null, { addSpecialTokens: false });
  seconds.push(Number(process.hrtime.bigint() - start) / 1e9);
  ids = encoding.getIds();
}
writeFileSync(idsPath, JSON.stringify(ids));
console.log(JSON.stringify({ seconds, tokens: ids.length }));
