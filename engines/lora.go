package engines

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// LoRA adapters as the engines serve them: vLLM's vllm:lora_requests_info
// gauge, the /v1/models cards of adapters, and the runtime load and unload
// endpoints (vLLM's with VLLM_ALLOW_RUNTIME_LORA_UPDATING set, SGLang's).

// LoRAInfo is what a pod's vllm:lora_requests_info says: its max_lora and
// the adapters of its running and waiting requests.
type LoRAInfo struct {
	MaxLoras         int
	Running, Waiting []string
}

// loraInfoMetric is vLLM's gauge; its value is the time it was set (Unix
// seconds), its labels the state.
const loraInfoMetric = "vllm:lora_requests_info"

// Its labels.
const (
	labelMaxLora = "max_lora"
	labelRunning = "running_lora_adapters"
	labelWaiting = "waiting_lora_adapters"
)

// ParseLoRAInfo reads the latest vllm:lora_requests_info sample (the
// greatest value: vLLM sets a new label set with the time as value and
// may keep old ones) from a Prometheus text exposition. ok is false when
// there is none: the engine serves no adapters, or is not vLLM.
func ParseLoRAInfo(text []byte) (info LoRAInfo, ok bool) {
	best := 0.0
	for len(text) > 0 {
		var line []byte
		line, text, _ = bytes.Cut(text, []byte{'\n'})
		rest, found := bytes.CutPrefix(line, []byte(loraInfoMetric+"{"))
		if !found {
			continue
		}
		labels, value, found := cutLabels(rest)
		if !found {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(string(value)), 64)
		if err != nil || (ok && v < best) {
			continue
		}
		var cand LoRAInfo
		for k, val := range labels {
			switch k {
			case labelMaxLora:
				cand.MaxLoras, _ = strconv.Atoi(val)
			case labelRunning:
				cand.Running = splitAdapters(val)
			case labelWaiting:
				cand.Waiting = splitAdapters(val)
			}
		}
		info, best, ok = cand, v, true
	}
	return info, ok
}

// cutLabels parses the label set after a metric name's '{' (name="value"
// pairs, values with \\, \" and \n escapes) and returns it with the text
// after the closing '}'; found is false for a malformed set.
func cutLabels(b []byte) (labels map[string]string, rest []byte, found bool) {
	labels = map[string]string{}
	for {
		b = bytes.TrimLeft(b, " ,")
		if len(b) > 0 && b[0] == '}' {
			return labels, b[1:], true
		}
		eq := bytes.IndexByte(b, '=')
		if eq <= 0 || eq+1 >= len(b) || b[eq+1] != '"' {
			return nil, nil, false
		}
		name := string(bytes.TrimSpace(b[:eq]))
		b = b[eq+2:]
		var val []byte
		for {
			if len(b) == 0 {
				return nil, nil, false
			}
			c := b[0]
			b = b[1:]
			if c == '"' {
				break
			}
			if c == '\\' && len(b) > 0 {
				c, b = b[0], b[1:]
				if c == 'n' {
					c = '\n'
				}
			}
			val = append(val, c)
		}
		labels[name] = string(val)
	}
}

// splitAdapters splits vLLM's comma-joined adapter names.
func splitAdapters(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// ModelCard is one entry of an engine's /v1/models: an adapter has its
// base model as parent, and its path as root (vLLM's ModelCard).
type ModelCard struct {
	ID     string `json:"id"`
	Root   string `json:"root,omitempty"`
	Parent string `json:"parent,omitempty"`
}

// ParseModelList reads an OpenAI /v1/models answer.
func ParseModelList(body []byte) ([]ModelCard, error) {
	var l struct {
		Data []ModelCard `json:"data"`
	}
	if err := json.Unmarshal(body, &l); err != nil {
		return nil, fmt.Errorf("engines: /v1/models: %w", err)
	}
	return l.Data, nil
}

// AdapterRequest is the body of a load or unload call: vLLM's
// LoadLoRAAdapterRequest and UnloadLoRAAdapterRequest, SGLang's
// LoadLoRAAdapterReqInput and UnloadLoRAAdapterReqInput.
type AdapterRequest struct {
	Name string `json:"lora_name"`
	Path string `json:"lora_path,omitempty"`
}

// ErrNoAdapterAPI is LoadAdapterPath's for an engine without one.
var ErrNoAdapterAPI = errors.New("engines: the engine has no API to load LoRA adapters")

// AdapterPaths returns the paths of k's load and unload endpoints.
func AdapterPaths(k Kind) (load, unload string, err error) {
	switch k {
	case VLLM:
		return "/v1/load_lora_adapter", "/v1/unload_lora_adapter", nil
	case SGLang:
		return "/load_lora_adapter", "/unload_lora_adapter", nil
	}
	return "", "", fmt.Errorf("%w (%s)", ErrNoAdapterAPI, k)
}

// AdapterLoaded reads an engine's answer to a load call: nil when the
// adapter is there now, loaded by this call or before (vLLM answers 400
// "has already been loaded"); else the engine's reason.
func AdapterLoaded(k Kind, status int, body []byte) error {
	if k == SGLang && status == 200 {
		// SGLang answers 200 with {"success": false, "error_message"} too.
		var out struct {
			Success bool   `json:"success"`
			Message string `json:"error_message"`
		}
		if json.Unmarshal(body, &out) == nil && !out.Success {
			return fmt.Errorf("engines: adapter not loaded: %s", out.Message)
		}
		return nil
	}
	if status == 200 || (k == VLLM && status == 400 && bytes.Contains(body, []byte("has already been loaded"))) {
		return nil
	}
	var e struct {
		Message string `json:"message"`
		Error   struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	msg := string(body)
	if json.Unmarshal(body, &e) == nil {
		msg = cmp.Or(e.Message, e.Error.Message, msg)
	}
	return fmt.Errorf("engines: adapter not loaded (status %d): %s", status, msg)
}
