package config

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"pdlb/internal/tokfiles"
	"pdlb/internal/yamlkeys"
)

// TestREADMEConfigurationIsDefault: every value the README's
// Configuration block shows is the default the code applies, bar the
// examples listed here, so the block an SRE copies says what pdlb does.
// A list entry's settings are compared with a provisioned entry's.
func TestREADMEConfigurationIsDefault(t *testing.T) {
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, _ := strings.Cut(string(data), "### Configuration\n")
	_, block, _ = strings.Cut(block, "```yaml\n")
	block, _, _ = strings.Cut(block, "```")
	var readme yaml.Node
	if err := yaml.Unmarshal([]byte(block), &readme); err != nil || block == "" {
		t.Fatalf("README's Configuration block: %v", err)
	}
	def := Default()
	def.Models = []Model{def.ModelFor("llama")}
	def.Aliases = []Alias{{Targets: []AliasTarget{{}}}}
	def.Pods = []Pod{{Model: "llama", Address: "10.0.0.5:8000"}}
	def.Provision()
	var defaults yaml.Node
	if err := defaults.Encode(def); err != nil {
		t.Fatal(err)
	}
	want := map[string]*yaml.Node{}
	yamlkeys.Walk(&defaults, reflect.TypeFor[Config](), "", func(path string, _, value *yaml.Node, _ reflect.Type, _ map[string]reflect.Type) {
		want[path] = value
	})
	// Values the block shows as examples of what one may write.
	examples := map[string]bool{
		"aliases[0].name": true, "aliases[0].targets[0].model": true, "aliases[0].targets[0].weight": true,
		"pods[0].name": true,
		// SGLang's default, shown on the example's vllm pod.
		"pods[0].bootstrap_port": true,
	}
	yamlkeys.Walk(&readme, reflect.TypeFor[Config](), "", func(path string, _, value *yaml.Node, ft reflect.Type, _ map[string]reflect.Type) {
		w, ok := want[path]
		// A struct, or a list of them, is compared key by key.
		if ft == nil || examples[path] || !ok || inner(ft).Kind() == reflect.Struct {
			return
		}
		got, exp := reflect.New(ft), reflect.New(ft)
		if err := value.Decode(got.Interface()); err != nil {
			t.Errorf("README: %s: %v", path, err)
			return
		}
		if err := w.Decode(exp.Interface()); err != nil {
			t.Fatalf("default %s: %v", path, err)
		}
		// %v prints a nil slice or map as an empty one, as the block writes them.
		if g, e := fmt.Sprintf("%v", got.Elem()), fmt.Sprintf("%v", exp.Elem()); g != e {
			t.Errorf("README: %s: %s (line %d), but the default is %s", path, g, value.Line, e)
		}
	})
}

// inner is t past its pointers and slices.
func inner(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	return t
}

// TestREADMEExamplesLoad: every YAML block of README.md and
// docs/tuning.md is a configuration pdlb serve takes (decoded strictly,
// provisioned, validated), once the files it names exist: its
// placeholders become files made here, the tokenizer tests/tokref holds
// and a digest. A block without pods, a fragment, gets one.
func TestREADMEExamplesLoad(t *testing.T) {
	dir := t.TempDir()
	pem := filepath.Join(dir, "x.pem")
	if err := os.WriteFile(pem, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, doc := range []string{"README.md", "docs/tuning.md"} {
		data, err := os.ReadFile("../../" + doc)
		if err != nil {
			t.Fatal(err)
		}
		blocks := strings.Split(string(data), "```yaml\n")[1:]
		if doc == "README.md" && len(blocks) < 3 {
			t.Fatalf("README.md: %d YAML blocks, want the Configuration, tokenizer and tracing ones", len(blocks))
		}
		for i, block := range blocks {
			block, _, _ = strings.Cut(block, "```")
			t.Run(doc+"#"+strconv.Itoa(i), func(t *testing.T) {
				tokenizer := "/models/Qwen3-8B"
				if strings.Contains(block, tokenizer) {
					tokenizer = tokfiles.Dir(t, "qwen3")
				}
				block = strings.NewReplacer("/etc/pdlb/tls.crt", pem, "/etc/pdlb/tls.key", pem,
					"/models/Qwen3-8B", tokenizer, "<hex digest>", strings.Repeat("ab", 32)).Replace(block)
				c := Default()
				if err := c.UnmarshalYAML([]byte(block)); err != nil {
					t.Fatalf("%v in:\n%s", err, block)
				}
				if len(c.Pods) == 0 {
					model := "m"
					if len(c.Models) > 0 {
						model = c.Models[0].Name
					}
					c.Pods = []Pod{{Model: model, Address: "10.0.0.5:8000"}}
				}
				c.Provision()
				if err := c.Validate(); err != nil {
					t.Fatalf("%v in:\n%s", err, block)
				}
			})
		}
	}
}
