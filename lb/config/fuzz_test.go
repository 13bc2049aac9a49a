package config

import (
	"bytes"
	"testing"

	"gopkg.in/yaml.v3"
)

// FuzzConfig feeds arbitrary YAML to the loader. Decoding and Validate must
// never panic, and a configuration Load accepts (decoded, provisioned,
// validated) must be a fixed point: validated again it is still accepted,
// and written back to YAML and loaded it validates to the same document.
// Provisioned, it writes no 0 that means "unset" (zeroIsUnset). Documents are compared rather than
// values so that NaN fields, which yaml accepts (.nan), compare equal. The
// seed corpus is in testdata/fuzz/FuzzConfig.
func FuzzConfig(f *testing.F) {
	f.Add([]byte("pods: [{model: m, address: '127.0.0.1:8001'}]\n"))
	f.Add([]byte("discovery: {dns: [{name: x, port: 1, model: m}]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c := Default()
		if c.UnmarshalYAML(data) != nil {
			return
		}
		c.Provision()
		if c.Validate() != nil {
			return
		}
		first := marshal(t, c)
		if err := c.Validate(); err != nil {
			t.Fatalf("a validated config fails Validate again: %v\n%s", err, first)
		}
		again := Default()
		if err := again.UnmarshalYAML(first); err != nil {
			t.Fatalf("a validated config does not load back: %v\n%s", err, first)
		}
		if err := again.Validate(); err != nil {
			t.Fatalf("a validated config loaded back fails Validate: %v\n%s", err, first)
		}
		if second := marshal(t, again); !bytes.Equal(first, second) {
			t.Fatalf("not a fixed point:\n%s\n---\n%s", first, second)
		}
	})
}

func marshal(t *testing.T, c Config) []byte {
	t.Helper()
	b, err := yaml.Marshal(c)
	if err != nil {
		t.Fatalf("yaml.Marshal: %v", err)
	}
	return b
}
