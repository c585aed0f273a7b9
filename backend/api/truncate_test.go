package api

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTruncateKeepsUTF8(t *testing.T) {
	ua := strings.Repeat("é", 300) // 600 bytes; byte 512 is mid-character
	got := truncate(ua, 511)
	if !utf8.ValidString(got) || len(got) > 511 || len(got) < 509 {
		t.Fatalf("truncate to 511 bytes = %d bytes, valid UTF-8 %t", len(got), utf8.ValidString(got))
	}
	if got := truncate("short", 511); got != "short" {
		t.Fatalf("truncate(short) = %q", got)
	}
}
