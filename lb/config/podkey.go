package config

import (
	"fmt"
	"os"
	"strings"
)

// PodKey is the API key a pod's engine was started with (vLLM's and
// SGLang's --api-key, VLLM_API_KEY): the gateway sends it as
// Authorization: Bearer on every request it makes to the pod, in place
// of the client's Authorization and x-api-key. At most one field is set;
// a pod's own key comes before its model's (Config.PodKeyOf).
type PodKey struct {
	// APIKey is the key itself (default "": none).
	APIKey string `yaml:"api_key"`
	// APIKeyFile is a file holding the key, as a Kubernetes secret is
	// mounted: read at start and on each reload, the whitespace around it
	// dropped (default "").
	APIKeyFile string `yaml:"api_key_file"`
	// APIKeyEnv names the environment variable holding the key, read at
	// start and on each reload (default "").
	APIKeyEnv string `yaml:"api_key_env"`
}

// set reports whether k names a key.
func (k PodKey) set() bool { return k != PodKey{} }

// read returns the key k names, "" for none; errors name field (a pod or
// a model) and the file or variable, never the key.
func (k PodKey) read(field string, lookupEnv func(string) (string, bool)) (string, error) {
	switch {
	case k.APIKey != "" && k.APIKeyFile != "":
		return "", invalid(field+".api_key_file", k.APIKeyFile, "is set with api_key: give one of api_key, api_key_file and api_key_env")
	case k.APIKeyEnv != "" && (k.APIKey != "" || k.APIKeyFile != ""):
		return "", invalid(field+".api_key_env", k.APIKeyEnv, "is set with api_key or api_key_file: give one of api_key, api_key_file and api_key_env")
	}
	key, from, name := k.APIKey, ".api_key", "(not shown)"
	switch {
	case k.APIKeyFile != "":
		b, err := os.ReadFile(k.APIKeyFile)
		if err != nil {
			return "", invalid(field+".api_key_file", k.APIKeyFile, "cannot be read: "+err.Error())
		}
		key, from, name = strings.TrimSpace(string(b)), ".api_key_file", k.APIKeyFile
		if key == "" {
			return "", invalid(field+from, name, "holds no key")
		}
	case k.APIKeyEnv != "":
		v, _ := lookupEnv(k.APIKeyEnv)
		key, from, name = strings.TrimSpace(v), ".api_key_env", k.APIKeyEnv
		if key == "" {
			return "", invalid(field+from, name, "is not set in the environment, or empty")
		}
	}
	// It goes in a header field's value, after "Bearer ".
	if strings.ContainsFunc(key, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return "", invalid(field+from, name, "holds a key with spaces or control characters, which no Authorization header carries")
	}
	return key, nil
}

// PodKeyOf returns the key pods[i] is sent (the pod's own, else its
// model's), "" for none, with os.LookupEnv for api_key_env.
func (c *Config) PodKeyOf(i int) (string, error) {
	p := c.Pods[i]
	if p.PodKey.set() {
		return p.PodKey.read(fmt.Sprintf("pods[%d]", i), os.LookupEnv)
	}
	for j := range c.Models {
		if c.Models[j].Name == p.Model {
			return c.Models[j].PodKey.read(fmt.Sprintf("models[%d]", j), os.LookupEnv)
		}
	}
	return "", nil
}
