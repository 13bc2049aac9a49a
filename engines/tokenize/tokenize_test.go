package tokenize

import (
	"bytes"
	"testing"
)

func TestAppend(t *testing.T) {
	f := func(text string, want []uint32) {
		t.Helper()
		got := Append(nil, []byte(text))
		if len(got) != len(want) {
			t.Fatalf("Append(%q) = %v, want %v", text, got, want)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("Append(%q) = %v, want %v", text, got, want)
			}
		}
		if Count([]byte(text)) != len(want) {
			t.Fatalf("Count(%q) = %d, want %d", text, Count([]byte(text)), len(want))
		}
	}
	f("", nil)
	f("a", []uint32{'a'})
	f("abcd", []uint32{'a' | 'b'<<8 | 'c'<<16 | 'd'<<24})
	f("abcde", []uint32{'a' | 'b'<<8 | 'c'<<16 | 'd'<<24, 'e'})
}

func TestPrefixStable(t *testing.T) {
	var p []byte
	p = AppendTurn(p, []byte("system"), []byte("You are helpful."))
	p = AppendTurn(p, []byte("user"), []byte("hi"))
	short := Append(nil, p)
	longer := AppendTurn(bytes.Clone(p), []byte("assistant"), []byte("hello there"))
	long := Append(nil, longer)
	full := len(p) / BytesPerToken
	for i := 0; i < full; i++ {
		if short[i] != long[i] {
			t.Fatalf("token %d changed when the conversation grew", i)
		}
	}
}

func TestTurnPartsMatchWhole(t *testing.T) {
	whole := AppendTurn(nil, []byte("user"), []byte("hello world"))
	parts := AppendTurnOpen(nil, []byte("user"))
	parts = append(parts, "hello "...)
	parts = append(parts, "world"...)
	parts = AppendTurnClose(parts)
	if !bytes.Equal(whole, parts) {
		t.Fatalf("parts render %q, whole %q", parts, whole)
	}
}
