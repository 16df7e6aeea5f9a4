// Writes the tokenizer.json of one of js-tiktoken's encodings (OpenAI's
// o200k_base, cl100k_base: real 200k- and 100k-token vocabularies) the way
// transformers' TikTokenConverter writes one: byte-level vocabulary by rank,
// every split of a token into two tokens as a merge ranked by the token,
// tiktoken's regex as a Split pre-tokenizer, ignore_merges (tiktoken takes
// a piece that is a token as it is), the special tokens as added tokens.
//   node tiktoken_tokenizer_json.mjs o200k_base out.json
import { writeFileSync } from 'node:fs';

const [encoding, outPath] = process.argv.slice(2);
const ranks = (await import(`js-tiktoken/ranks/${encoding}`)).default;

// GPT-2's byte-level alphabet: printable bytes stand for themselves, the
// others take U+0100 onwards in order.
const byteChar = [];
let next = 256;
for (let b = 0; b < 256; ++b) {
  const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  byteChar.push(String.fromCodePoint(printable ? b : next++));
}
const spell = (bytes) => Array.from(bytes, (b) => byteChar[b]).join('');

// js-tiktoken's compressed ranks: lines "<prefix> <first rank> <base64 token>...".
const tokens = [];  // [bytes, rank]
for (const line of ranks.bpe_ranks.split('\n')) {
  if (!line) continue;
  const [, first, ...encoded] = line.split(' ');
  encoded.forEach((b64, i) => tokens.push([Buffer.from(b64, 'base64'), Number(first) + i]));
}
const rankOf = new Map(tokens.map(([bytes, rank]) => [bytes.toString('latin1'), rank]));

const vocab = {};
const merges = [];  // [left, right, rank of the merged token]
for (const [bytes, rank] of tokens) {
  vocab[spell(bytes)] = rank;
  if (bytes.length < 2) continue;
  const local = [];
  for (let i = 1; i < bytes.length; ++i) {
    const left = bytes.subarray(0, i).toString('latin1');
    const right = bytes.subarray(i).toString('latin1');
    if (rankOf.has(left) && rankOf.has(right)) local.push([left, right, rank]);
  }
  local.sort((a, b) => rankOf.get(a[0]) - rankOf.get(b[0]) || rankOf.get(a[1]) - rankOf.get(b[1]));
  merges.push(...local);
}
merges.sort((a, b) => a[2] - b[2]);
const latin1Spell = (s) => spell(Buffer.from(s, 'latin1'));

const addedTokens = Object.entries(ranks.special_tokens).map(([content, id]) => ({
  id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
}));
const tokenizer = {
  version: '1.0',
  truncation: null,
  padding: null,
  added_tokens: addedTokens,
  normalizer: null,
  pre_tokenizer: {
    type: 'Sequence',
    pretokenizers: [
      { type: 'Split', pattern: { Regex: ranks.pat_str }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false },
    ],
  },
  post_processor: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
  decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: {
    type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
    fuse_unk: false, byte_fallback: false, ignore_merges: true, vocab,
    merges: merges.map(([l, r]) => [latin1Spell(l), latin1Spell(r)]),
  },
};
writeFileSync(outPath, JSON.stringify(tokenizer));
console.log(`${encoding}: ${tokens.length} tokens, ${merges.length} merges -> ${outPath}`);
