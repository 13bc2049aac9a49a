package config

import (
	"errors"
	"strings"
	"testing"
)

// TestAdminAndListenApart: the listeners bind with SO_REUSEPORT, so an
// admin address that overlaps listen's binds without error and the kernel
// hands the API's connections to the admin listener (all of them, for a
// more specific address; half, for the same one). Validate refuses it.
func TestAdminAndListenApart(t *testing.T) {
	f := func(listen, admin string, refused bool) {
		t.Helper()
		c := Default()
		c.Listen, c.Admin, c.Access.AdminToken = listen, admin, "t"
		c.Pods = []Pod{{Model: "m", Address: "127.0.0.1:8001"}}
		c.Provision()
		err := c.Validate()
		if !refused {
			if err != nil {
				t.Errorf("listen %q, admin %q: %v", listen, admin, err)
			}
			return
		}
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `admin = "`+admin+`"`) {
			t.Errorf("listen %q, admin %q: %v, want an error naming admin", listen, admin, err)
		}
	}
	f("127.0.0.1:9090", "127.0.0.1:9090", true)
	f(":9090", "127.0.0.1:9090", true)
	f("127.0.0.1:9090", "[::]:9090", true)
	f(":8080", "127.0.0.1:9090", false)
	f("127.0.0.1:9090", "127.0.0.2:9090", false)
	f("127.0.0.1:0", "127.0.0.1:0", false)
	f(":9090", "", false)
}

// TestMetricsApart: the metrics listener overlaps neither listen nor admin,
// for the same reason.
func TestMetricsApart(t *testing.T) {
	f := func(metrics, refusedFor string) {
		t.Helper()
		c := Default()
		c.Listen, c.Admin, c.Metrics = ":8080", "127.0.0.1:9090", metrics
		c.Pods = []Pod{{Model: "m", Address: "127.0.0.1:8001"}}
		c.Provision()
		err := c.Validate()
		if refusedFor == "" {
			if err != nil {
				t.Errorf("metrics %q: %v", metrics, err)
			}
			return
		}
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `metrics = "`+metrics+`"`) || !strings.Contains(err.Error(), refusedFor) {
			t.Errorf("metrics %q: %v, want an error naming metrics and %s", metrics, err, refusedFor)
		}
	}
	f(":9100", "")
	f("", "")
	f("127.0.0.1:8080", "listen")
	f(":9090", "admin")
	f("9100", "host:port")
}

// TestAdminTokenRequired: an admin listener beyond loopback wants a
// token, and the refusal names admin_token as the file spells it (a top
// level key), not under the limits package's prefix.
func TestAdminTokenRequired(t *testing.T) {
	c := Default()
	c.Admin = ":9090"
	c.Pods = []Pod{{Model: "m", Address: "127.0.0.1:8001"}}
	c.Provision()
	err := c.Validate()
	if want := `config: invalid: admin_token = "" must be set when admin (":9090") is not a loopback address`; err == nil || err.Error() != want {
		t.Fatalf("got %v, want %s", err, want)
	}
}
