package gateway

import (
	"strings"
	"testing"
)

func TestIsHopByHop(t *testing.T) {
	for _, h := range hopByHop {
		for _, k := range []string{string(h), strings.ToLower(string(h)), strings.ToUpper(string(h))} {
			if !isHopByHop([]byte(k)) {
				t.Errorf("%q is hop-by-hop", k)
			}
		}
	}
	for _, k := range []string{"", "X", "Content-Type", "Connections", "Authorization", "X-Request-Id", "Proxy-Authorization-X"} {
		if isHopByHop([]byte(k)) {
			t.Errorf("%q is not hop-by-hop", k)
		}
	}
}
