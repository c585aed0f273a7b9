package wire

import (
	"crypto/sha256"
	"encoding/hex"
)

// MaxValueBytes bounds a descriptor value as nodes report it (a stats top
// value, a quota usage value) and the console stores it.
const MaxValueBytes = 256

// valueHashTail is what Value appends to a value it had to change: "…"
// and 16 hex digits of the SHA-256 of the value as it was.
const valueHashTail = len("…") + 16

// Value returns descriptor value v in the form nodes report it and the
// console stores it: v itself when it is valid UTF-8 without NUL and at most
// MaxValueBytes long; otherwise v cleaned (CleanText: each NUL and invalid
// UTF-8 sequence becomes U+FFFD), cut to leave room, then "…" and 16 hex
// digits of the SHA-256 of v's bytes, so distinct values stay distinct
// (unless their hashes collide) and the result is text Postgres accepts.
//
// It is the one cleaning of values on both sides: the engine names values
// with it, and the console applies it again to what a node sent, which
// changes nothing a node built with it (Value(Value(v)) == Value(v)).
func Value(v string) string {
	if len(v) <= MaxValueBytes && isText(v) {
		return v
	}
	sum := sha256.Sum256([]byte(v))
	// Cut before cleaning too, so a long value costs only its prefix.
	n := MaxValueBytes - valueHashTail
	return Cut(CleanText(Cut(v, n)), n) + "…" + hex.EncodeToString(sum[:8])
}
