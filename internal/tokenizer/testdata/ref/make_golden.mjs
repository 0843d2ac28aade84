// make_golden.mjs writes the reference encodings the Go tests compare against:
//
//   ../golden.jsonl       {"name", "text", "ids", "decoded"} per line
//   ../chat_golden.jsonl  {"name", "messages", "add_generation_prompt", "text", "ids"} per line
//
// The reference is @lenml/tokenizers (a dependency-free port of transformers.js's
// tokenizers) reading the vendored tokenizer.json and tokenizer_config.json
// of tokenizer/qwen2.5 (at the top of the repository). Run: npm ci && node
// make_golden.mjs
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { TokenizerLoader } from "@lenml/tokenizers";

const here = path.dirname(fileURLToPath(import.meta.url));
const modelDir = path.join(here, "..", "..", "..", "..", "tokenizer", "qwen2.5");
const readJSON = (f) => JSON.parse(fs.readFileSync(path.join(modelDir, f), "utf8"));
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: readJSON("tokenizer.json"),
  tokenizerConfig: readJSON("tokenizer_config.json"),
});
const encode = (text) => Array.from(tok.encode(text, { add_special_tokens: false }));
const decode = (ids) => (ids.length === 0 ? "" : tok.decode(ids, { skip_special_tokens: false }));

// The reference must agree with encodings known from Hugging Face's Python
// library before anything is written.
const known = [
  ["Hello world", [9707, 1879]],
  ["<|im_start|>user\n", [151644, 872, 198]],
  ["\n\n", [271]],
  ["<think>", [13708, 766, 29]],
  ["0123456789", [15, 16, 17, 18, 19, 20, 21, 22, 23, 24]],
];
for (const [text, want] of known) {
  const got = encode(text);
  if (JSON.stringify(got) !== JSON.stringify(want)) {
    console.error(`reference disagrees on ${JSON.stringify(text)}: got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
    process.exit(1);
  }
}

// Hand-written cases: [name, text].
const longParagraph =
  "Reinforcement learning from human feedback (RLHF) fine-tunes a language model against a reward model. " +
  "In 2022, InstructGPT showed that a 1.3B-parameter model, tuned this way, was preferred over the 175B GPT-3 " +
  "by labelers 85 ± 3% of the time!  Isn't that surprising?\n\nGRPO (Group Relative Policy Optimization) drops the " +
  "critic: it samples G=8 completions per prompt, normalizes rewards within the group — r̂ᵢ = (rᵢ − mean)/std — and " +
  "uses them as advantages.\tCosts: ~50% less memory; see arXiv:2402.03300 §4.1. 中文也可以：奖励模型、策略梯度。\n";
const cases = [
  ["empty", ""],
  ["hello_world", "Hello world"],
  ["im_start_user", "<|im_start|>user\n"],
  ["two_newlines", "\n\n"],
  ["think_tag", "<think>"],
  ["digits", "0123456789"],
  ["numbers_in_text", "The year 2024 had 366 days; pi is 3.14159, not 22/7."],
  ["contraction_upper", "DON'T"],
  ["contraction_mixed", "We'Ll I'M she'S THEY'RE you'VE he'D It'S"],
  ["contraction_lower", "don't won't can't we'll i'm they're you've he'd it's"],
  ["apostrophes", "'s ''s 'rock 'n' roll' O'Neil's rock'n'roll '"],
  ["space_runs", "a  b   c    d     e"],
  ["leading_trailing_spaces", "   leading and trailing   "],
  ["single_space", " "],
  ["only_spaces", "        "],
  ["tabs", "\t\tindented\twith\t \ttabs\t"],
  ["newline_runs", "x\n\n\ny\n\n\n\n\nz\n"],
  ["crlf", "line1\r\nline2\r\n\r\nline3\r"],
  ["space_newline_mix", "a \n b  \n\n  c \t\n\t d"],
  ["python_code", "def f(x):\n    if x > 0:\n        return x ** 2\n    return -x  # negative\n"],
  ["punct_runs", "Wait!!! Really?!?! Yes... no --- maybe ;;; ok."],
  ["punct_newlines", "end.\n\nNext!!\n\n\n\"quoted\"\n"],
  ["brackets", "(a) [b] {c} <d> «e» “f” ‘g’"],
  ["url_email", "Mail me@example.com or see https://example.com/a/b?q=1&r=2#frag"],
  ["markdown", "```python\nprint('hi')\n```\n\n- item **bold** _it_\n> quote"],
  ["html", "<html><body class=\"x\">Hi &amp; bye</body></html>"],
  ["money_math", "$1,234.56 + 7.5% = ? (≈ €1.3k) 2^10 = 1024; a_i <= b_j"],
  ["cjk_chinese", "你好，世界！今天天气很好。"],
  ["cjk_japanese", "日本語のテキストとカタカナ、ひらがな。"],
  ["cjk_korean", "한국어 텍스트입니다. 안녕하세요!"],
  ["cjk_mixed", "中文English混合123テスト"],
  ["fullwidth", "全角：１２３ＡＢＣ！"],
  ["emoji", "😀 😂 🎉🎉🎉 ok👍"],
  ["emoji_skin_tone", "👍🏽 👋🏿"],
  ["emoji_zwj_family", "👨‍👩‍👧 family 👩‍💻"],
  ["emoji_flags", "🇺🇸🇯🇵🇩🇪"],
  ["emoji_vs16", "I ❤️ Go ☀️"],
  ["emoji_in_words", "emoji😀in😀text"],
  ["combining_acute_decomposed", "Cafe\u0301 re\u0301sume\u0301"],
  ["combining_diaeresis_ring", "na\u0308ive A\u030Angstro\u0308m n\u0303"],
  ["combining_no_precomposed", "q\u0301 x\u0308\u0301 z\u0327"],
  ["hangul_jamo", "\u1100\u1161\u11A8 \u1112\u1161\u11AB"],
  ["precomposed_latin", "über straße façade øre Ærø"],
  ["cyrillic_greek", "Привет, мир! Γειά σου Κόσμε."],
  ["arabic_hebrew", "مرحبا بالعالم שלום עולם"],
  ["devanagari_thai", "नमस्ते दुनिया สวัสดีชาวโลก"],
  ["unicode_spaces", "a\u00a0b\u3000c\u2003\u2003d\u2009e"],
  ["other_digits", "٣٤٥ ५६ ½ ² Ⅻ ①"],
  ["special_chat", "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"],
  ["special_endoftext_inline", "text<|endoftext|>more<|endoftext|><|endoftext|>"],
  ["tool_call", "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"x\"}}\n</tool_call>"],
  ["partial_im", "<|im_"],
  ["partial_im_start", "<|im_start <|im_start| |im_start|> <|im_end"],
  ["nested_brackets_special", "<<|im_start|>>"],
  ["fim_tokens", "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>"],
  ["vision_tokens", "<|vision_start|><|image_pad|><|vision_end|>"],
  ["special_after_space", "a <|im_end|> b\n<|im_start|> c"],
  ["combining_after_special", "<|im_end|>\u0301x"],
  ["search_tags", "<think>\nreasoning\n</think>\n\n<search>query</search><information>doc</information><answer>42</answer>"],
  ["long_word", "a".repeat(300)],
  ["long_spaces", " ".repeat(100) + "x"],
  ["long_newlines", "\n".repeat(50)],
  ["long_digits", "31415926535897932384626433832795028841971693993751"],
  ["vt_ff", "a\u000bb\u000cc \u000b\n"],
  ["long_paragraph", longParagraph],
];

// Seeded fuzz strings drawn from the same character classes (mulberry32).
function mulberry32(seed) {
  return function () {
    seed |= 0;
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const rand = mulberry32(20240601);
const pick = (xs) => xs[Math.floor(rand() * xs.length)];
const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));
const times = (n, f) => Array.from({ length: n }, f).join("");
const randCase = (s) => Array.from(s, (c) => (rand() < 0.5 ? c.toUpperCase() : c.toLowerCase())).join("");

const words = ["the", "hello", "world", "token", "Go", "BPE", "data", "model", "a", "I", "x", "NASA", "iPhone", "reward"];
const addedTokens = readJSON("tokenizer.json").added_tokens.map((t) => t.content);
const partials = ["<|im_", "<|", "|>", "<|endoftext", "tool_call>", "</", "<|im_start", "im_end|>", "<think>", "</think>"];
const cjk = Array.from("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持音眾ひらがなカタカナ한국어텍스트안녕하세요");
const emoji = ["😀", "😂", "🎉", "👍", "👍🏽", "👋🏿", "👨‍👩‍👧", "👩‍💻", "🇺🇸", "🇯🇵", "❤️", "☀️", "🤖", "✅", "🚀", "💯", "🙏🏻"];
const combining = Array.from({ length: 0x36f - 0x300 + 1 }, (_, i) => String.fromCodePoint(0x300 + i));
const bases = Array.from("aeiouAEIOUnNcCqxzsS");
const otherScripts = ["Привет", "мир", "Γειά", "σου", "مرحبا", "שלום", "नमस्ते", "สวัสดี", "über", "straße", "façade", "øre"];
const uniSpaces = ["\u00a0", "\u3000", "\u2003", "\u2009", "\u2028"];
const otherDigits = ["٣", "٤", "५", "１", "２", "½", "²", "Ⅻ", "①"];
const punct = Array.from("!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~…—–·«»“”‘’¿¡。，！？、");

const atoms = [
  () => pick(words),
  () => randCase(pick(words)),
  () => " " + pick(words),
  () => times(int(1, 6), () => String(int(0, 9))),
  () => " ".repeat(int(1, 6)),
  () => "\t".repeat(int(1, 3)),
  () => "\n".repeat(int(1, 4)),
  () => pick(["\r\n", "\r", "\r\n\r\n", " \n", "\n ", " \t\n"]),
  () => times(int(1, 4), () => pick(punct)),
  () => "'" + randCase(pick(["s", "t", "re", "ve", "m", "ll", "d", "x", "ld"])),
  () => times(int(1, 5), () => pick(cjk)),
  () => pick(emoji),
  () => pick(bases) + times(int(1, 2), () => pick(combining)),
  () => pick(otherScripts),
  () => pick(uniSpaces),
  () => pick(otherDigits),
  () => pick(addedTokens),
  () => pick(partials),
];
const fuzz = [];
for (let i = 0; i < 300; i++) {
  const n = int(1, 30);
  fuzz.push([`fuzz_${String(i).padStart(3, "0")}`, times(n, () => pick(atoms)())]);
}

const lines = [...cases, ...fuzz].map(([name, text]) => {
  const ids = encode(text);
  return JSON.stringify({ name, text, ids, decoded: decode(ids) });
});
fs.writeFileSync(path.join(here, "..", "golden.jsonl"), lines.join("\n") + "\n");

// Chat template cases.
const chats = [
  ["user_only", [{ role: "user", content: "What is 2+2?" }], true],
  ["user_only_no_prompt", [{ role: "user", content: "What is 2+2?" }], false],
  ["system_user", [{ role: "system", content: "You are terse." }, { role: "user", content: "Hi" }], true],
  ["multi_turn", [
    { role: "user", content: "Hi" },
    { role: "assistant", content: "Hello! How can I help?" },
    { role: "user", content: "Tell me a joke.\nA short one." },
  ], true],
  ["assistant_last_no_prompt", [
    { role: "system", content: "Be kind." },
    { role: "user", content: "Hi" },
    { role: "assistant", content: "<think>\nok\n</think>\n\n<answer>Hello</answer>" },
  ], false],
  ["later_system", [
    { role: "user", content: "Hi" },
    { role: "system", content: "New rule." },
    { role: "user", content: "Again" },
  ], true],
  ["tools", [
    { role: "user", content: "Weather?" },
    { role: "assistant", content: "<tool_call>\n{\"name\": \"w\"}\n</tool_call>" },
    { role: "tool", content: "{\"t\": 20}" },
    { role: "tool", content: "{\"t\": 21}" },
    { role: "assistant", content: "20 and 21." },
    { role: "tool", content: "late" },
  ], true],
  ["assistant_first", [{ role: "assistant", content: "I start." }, { role: "user", content: "ok" }], true],
  ["empty_contents", [{ role: "system", content: "" }, { role: "user", content: "" }], true],
  ["unknown_role", [{ role: "user", content: "a" }, { role: "developer", content: "dropped" }, { role: "user", content: "b" }], true],
  ["unicode_content", [{ role: "user", content: "Cafe\u0301 😀 你好  \n\n" }], true],
];
const chatLines = chats.map(([name, messages, add_generation_prompt]) => {
  const text = tok.apply_chat_template(messages, { tokenize: false, add_generation_prompt });
  return JSON.stringify({ name, messages, add_generation_prompt, text, ids: encode(text) });
});
fs.writeFileSync(path.join(here, "..", "chat_golden.jsonl"), chatLines.join("\n") + "\n");
console.log(`wrote ${lines.length} encodings and ${chatLines.length} chats`);
