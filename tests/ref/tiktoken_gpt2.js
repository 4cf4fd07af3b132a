// tiktoken_gpt2.js - the reference GPT-2 ids for test_bpe and bench_bpe:
// OpenAI's tiktoken (npm "tiktoken", WebAssembly) with its "gpt2" encoding.
//
//   node tiktoken_gpt2.js [--eot-between-files] FILE...   ids, one per line
//   node tiktoken_gpt2.js --bench N FILE                 N timed encodes of
//        FILE; prints "tokens T seconds s1 s2 ..." (encode only, not I/O)
//
// Text is encoded with encode_ordinary ("<|endoftext|>" in a file is text).
// Invalid UTF-8: tiktoken's JS API takes strings, so the bytes are split here
// into maximal well-formed UTF-8 stretches (Unicode table 3-7, written anew
// from the standard) and single bad bytes; each stretch is encoded by
// tiktoken, each bad byte is its one-byte token (encode_single_token). That
// is the rule of worker/model/zs_bpe.h, so on invalid UTF-8 this checks the
// stretches against tiktoken and the rule against its statement here.
// Needs NODE_PATH (or a node_modules above) holding tiktoken.
"use strict";
const fs = require("fs");
const { get_encoding } = require("tiktoken");

// Length of the well-formed sequence at b[i], 0 if none starts there.
function wellFormed(b, i) {
  const c = b[i];
  const cont = (k, lo = 0x80, hi = 0xbf) => i + k < b.length && b[i + k] >= lo && b[i + k] <= hi;
  if (c <= 0x7f) return 1;
  if (c >= 0xc2 && c <= 0xdf) return cont(1) ? 2 : 0;
  if (c === 0xe0) return cont(1, 0xa0) && cont(2) ? 3 : 0;
  if ((c >= 0xe1 && c <= 0xec) || c === 0xee || c === 0xef) return cont(1) && cont(2) ? 3 : 0;
  if (c === 0xed) return cont(1, 0x80, 0x9f) && cont(2) ? 3 : 0;
  if (c === 0xf0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
  if (c >= 0xf1 && c <= 0xf3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
  if (c === 0xf4) return cont(1, 0x80, 0x8f) && cont(2) && cont(3) ? 4 : 0;
  return 0;
}

function encodeBytes(enc, b) {
  const out = [];
  let i = 0;
  while (i < b.length) {
    let j = i, l;
    while (j < b.length && (l = wellFormed(b, j)) > 0) j += l;
    if (j > i) for (const t of enc.encode_ordinary(b.subarray(i, j).toString("utf8"))) out.push(t);
    if (j < b.length) out.push(enc.encode_single_token(Uint8Array.of(b[j++])));
    i = j;
  }
  return out;
}

const args = process.argv.slice(2);
const enc = get_encoding("gpt2");
if (args[0] === "--bench") {
  const runs = Number(args[1]);
  const text = fs.readFileSync(args[2]); // valid UTF-8 expected: plain encode_ordinary
  const s = text.toString("utf8");
  const secs = [];
  let tokens = 0;
  for (let r = 0; r < runs; r++) {
    const t0 = process.hrtime.bigint();
    tokens = enc.encode_ordinary(s).length;
    secs.push(Number(process.hrtime.bigint() - t0) / 1e9);
  }
  console.log(`tokens ${tokens} seconds ${secs.join(" ")}`);
} else {
  let eot = false;
  if (args[0] === "--eot-between-files") {
    eot = true;
    args.shift();
  }
  const ids = [];
  args.forEach((f, k) => {
    if (eot && k > 0) ids.push(50256);
    for (const t of encodeBytes(enc, fs.readFileSync(f))) ids.push(t);
  });
  process.stdout.write(ids.join("\n") + (ids.length ? "\n" : ""));
}
enc.free();
