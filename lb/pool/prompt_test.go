package pool

import (
	"crypto/tls"
	"errors"
	"net"
	"testing"
	"time"

	"pdlb/internal/tokfiles"
	"pdlb/lb/config"
)

// Models with one tokenizer share one load, a rebuild keeps it and the
// index, and new settings load anew and start a new index (its keys name
// other ids).
func TestTokenizerLoadedOnce(t *testing.T) {
	dir := tokfiles.Dir(t, "llama2")
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "a", Tokenizer: dir}, {Name: "b", Tokenizer: dir}}
	cfg.Pods = []config.Pod{{Name: "p0", Model: "a", Address: "127.0.0.1:1"}, {Name: "p1", Model: "b", Address: "127.0.0.1:2"}}
	cfg.Provision()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	dial := func(string, time.Duration, *tls.Config) (net.Conn, error) { return nil, errors.New("no dials here") }
	s1, err := Build(&cfg, dial, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b := s1.model("a"), s1.model("b")
	if a.Prompt == nil || a.Prompt != b.Prompt {
		t.Fatalf("models a and b: tokenizers %p and %p, want one shared", a.Prompt, b.Prompt)
	}
	s2, err := Build(&cfg, dial, s1)
	if err != nil {
		t.Fatal(err)
	}
	if s2.model("a").Prompt != a.Prompt || s2.model("a").Prefix != a.Prefix {
		t.Fatal("a rebuild with the same settings loaded the tokenizer again or dropped the index")
	}
	cfg.Models[0].ChatTemplateKwargs = map[string]any{"x": 1}
	s3, err := Build(&cfg, dial, s2)
	if err != nil {
		t.Fatal(err)
	}
	if s3.model("a").Prompt == a.Prompt || s3.model("a").Prefix == a.Prefix || s3.model("b").Prompt != b.Prompt {
		t.Fatal("new settings for a kept its old tokenizer or index, or b lost its own")
	}
}
