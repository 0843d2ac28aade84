package tokenizer

// Byte-level mapping of GPT-2 (`bytes_to_unicode` in openai/gpt-2 encoder.py,
// ByteLevel in Hugging Face tokenizers): every byte gets a printable rune, so
// that vocabulary keys are readable strings. Bytes that are already printable
// Latin-1 map to themselves ('!'..'~', '¡'..'¬', '®'..'ÿ'); the other 68 map to
// U+0100 + n in byte order, e.g. ' ' (0x20) → 'Ġ' (U+0120), '\n' → 'Ċ' (U+010A).

// byteToRune maps a byte to its rune in vocabulary keys.
var byteToRune [256]rune

// runeToByte inverts byteToRune; the runes are all below 0x144.
var runeToByte = map[rune]byte{}

func init() {
	n := rune(0)
	for b := 0; b < 256; b++ {
		if ('!' <= b && b <= '~') || (0xA1 <= b && b <= 0xAC) || (0xAE <= b && b <= 0xFF) {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = 0x100 + n
			n++
		}
		runeToByte[byteToRune[b]] = byte(b)
	}
}

// byteLevelDecode turns a vocabulary key back into raw bytes. ok is false when
// the key holds a rune outside the byte-level alphabet.
func byteLevelDecode(key string) (raw []byte, ok bool) {
	raw = make([]byte, 0, len(key))
	for _, r := range key {
		b, found := runeToByte[r]
		if !found {
			return nil, false
		}
		raw = append(raw, b)
	}
	return raw, true
}
