package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPodKey: a pod's key is its own api_key, api_key_file (trimmed, as
// a mounted secret ends with a newline) or api_key_env, else its model's;
// a bad one is refused naming the setting and the file or variable,
// never the key.
func TestPodKey(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "key")
	if err := os.WriteFile(file, []byte("sk-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PDLB_TEST_POD_KEY", "sk-env")
	load := func(yml string) (Config, error) {
		t.Helper()
		c := Default()
		if err := c.UnmarshalYAML([]byte(yml)); err != nil {
			return c, err
		}
		c.Provision()
		return c, c.Validate()
	}
	ok := func(yml string, want ...string) {
		t.Helper()
		c, err := load(yml)
		if err != nil {
			t.Fatal(err)
		}
		for i, w := range want {
			if got, err := c.PodKeyOf(i); err != nil || got != w {
				t.Fatalf("pods[%d]: %q %v, want %q", i, got, err, w)
			}
		}
	}
	ok("models: [{name: m, api_key: sk-model}]\npods: [{model: m, address: 'h:1'}, {model: m, address: 'h:2', api_key_env: PDLB_TEST_POD_KEY}, {model: n, address: 'h:3'}]\n",
		"sk-model", "sk-env", "")
	ok("pods: [{model: m, address: 'h:1', api_key_file: "+file+"}]\n", "sk-file")
	bad := func(yml, want string) {
		t.Helper()
		_, err := load(yml)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Fatalf("error %v, want one with %q", err, want)
		}
		if strings.Contains(err.Error(), "sk-") {
			t.Fatalf("the error shows a key: %v", err)
		}
	}
	bad("pods: [{model: m, address: 'h:1', api_key: sk-a, api_key_file: "+file+"}]\n", `pods[0].api_key_file = "`+file+`" is set with api_key`)
	bad("pods: [{model: m, address: 'h:1', api_key: sk-a, api_key_env: PDLB_TEST_POD_KEY}]\n", `pods[0].api_key_env = "PDLB_TEST_POD_KEY" is set with api_key`)
	bad("pods: [{model: m, address: 'h:1', api_key_file: "+dir+"/none}]\n", `pods[0].api_key_file = "`+dir+`/none" cannot be read`)
	bad("pods: [{model: m, address: 'h:1', api_key_file: "+empty+"}]\n", "holds no key")
	bad("models: [{name: m, api_key_env: PDLB_TEST_NO_SUCH_VAR}]\npods: [{model: m, address: 'h:1'}]\n", `models[0].api_key_env = "PDLB_TEST_NO_SUCH_VAR" is not set`)
	bad("pods: [{model: m, address: 'h:1', api_key: 'sk-a b'}]\n", `pods[0].api_key = "(not shown)" holds a key with spaces`)
}
