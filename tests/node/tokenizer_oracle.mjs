// Hugging Face's tokenizers (its Rust library, through the official Node
// binding) as the oracle of tests/tokenizer_oracle_test.cc: encodes every
// string with every tokenizer.json of a job, with and without the special
// tokens its post-processor adds, decodes the ids (skipping special tokens
// and not), and decodes the job's id sequences, writing all of it as JSON.
//   node tokenizer_oracle.mjs job.json results.json
// job.json: {"tokenizers": [{"name", "file", "strings": [...], "id_sequences": [[...]]}]}
import { readFileSync, writeFileSync } from 'node:fs';
import { Tokenizer } from 'tokenizers';

const [jobPath, outPath] = process.argv.slice(2);
const job = JSON.parse(readFileSync(jobPath, 'utf8'));
const results = {};
for (const { name, file, strings, id_sequences: idSequences } of job.tokenizers) {
  const tokenizer = Tokenizer.fromFile(file);
  const encoded = [];
  for (const text of strings) {
    const plain = (await tokenizer.encode(text, null, { addSpecialTokens: false })).getIds();
    const special = (await tokenizer.encode(text, null, { addSpecialTokens: true })).getIds();
    encoded.push({
      ids: plain,
      with_special: special,
      decoded: await tokenizer.decode(plain, true),
      decoded_all: await tokenizer.decode(special, false),
    });
  }
  const decoded = [];
  for (const ids of idSequences) {
    decoded.push({ skip: await tokenizer.decode(ids, true), keep: await tokenizer.decode(ids, false) });
  }
  results[name] = { encoded, decoded };
}
writeFileSync(outPath, JSON.stringify(results));
