package config

import (
	"testing"
	"time"
)

// TestDiff: the first setting that differs, by its path in the file, with
// both values; inline sections' keys at their parent's level; credentials
// named without their values.
func TestDiff(t *testing.T) {
	f := func(edit func(*Config), want string) {
		t.Helper()
		a, b := Default(), Default()
		edit(&b)
		if got := Diff(a, b); got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
	f(func(*Config) {}, "")
	f(func(c *Config) { c.Upstream.Retries = 7 }, "upstream.retries: 1 → 7")
	f(func(c *Config) { c.Listen = ":9999" }, `listen: ":8080" → ":9999"`)
	f(func(c *Config) { c.ClientReadTimeout = time.Minute }, "client_read_timeout: 30s → 1m0s")
	f(func(c *Config) { c.Upstream.Retry.FirstByte.Factor = 2 }, "upstream.first_byte.factor: 0 → 2")
	f(func(c *Config) { c.Access.AdminToken = "s3cret" }, "admin_token")
	f(func(c *Config) { c.Models = []Model{{Name: "m", PodKey: PodKey{APIKey: "sk-pod"}}} }, "models")
	f(func(c *Config) { c.Pods = []Pod{{Model: "m", PodKey: PodKey{APIKeyEnv: "POD_KEY"}}} }, "pods")
}
