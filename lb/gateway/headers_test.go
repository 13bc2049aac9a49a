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

func TestEachNominated(t *testing.T) {
	f := func(v string, want ...string) {
		t.Helper()
		var got []string
		eachNominated([]byte(v), func(name []byte) { got = append(got, string(name)) })
		if strings.Join(got, "|") != strings.Join(want, "|") || nominates([]byte(v)) != (len(want) > 0) {
			t.Errorf("%q nominates %q, want %q", v, got, want)
		}
	}
	f("")
	f("close")
	f("keep-alive, Upgrade")
	f("X-Hop", "X-Hop")
	f(" close ,\tX-A,, x-b ,", "X-A", "x-b")
	f("keep-alive,X-A,close,", "X-A")
}
