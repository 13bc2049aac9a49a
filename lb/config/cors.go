package config

import (
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
)

// DefaultCORSMaxAge is how long a browser may keep a preflight's answer,
// Starlette's (the server of vLLM and SGLang) default.
const DefaultCORSMaxAge = 600 * time.Second

// CORS lets browsers call the API from pages of other origins, as the
// engines' own servers do: its fields and defaults are vLLM's
// --allowed-origins, --allowed-methods, --allowed-headers and
// --allow-credentials. The gateway answers preflights itself (before
// api_keys: a browser sends no credentials with one) and sets the
// Access-Control-* fields of every answer, its own errors included; the
// pods' are dropped, so a client never gets two.
type CORS struct {
	// AllowedOrigins are the origins ("https://app.example.com") whose
	// pages may call the API; "*" allows any (default ["*"], as vLLM);
	// "null" is what sandboxed and file:// pages send.
	// An empty list turns CORS off: no Access-Control-* fields but the
	// pods', and OPTIONS gets 405.
	AllowedOrigins []string `yaml:"allowed_origins"`
	// AllowedMethods and AllowedHeaders are what a preflight may ask
	// for; "*" allows any (default ["*"] each).
	AllowedMethods []string `yaml:"allowed_methods"`
	AllowedHeaders []string `yaml:"allowed_headers"`
	// AllowCredentials lets pages send cookies and see the answers to
	// them (default false); the answers then name the origin, never "*".
	AllowCredentials bool `yaml:"allow_credentials"`
	// ExposeHeaders are the answer's fields scripts may read besides the
	// always-safe ones (default none), e.g. x-request-id.
	ExposeHeaders []string `yaml:"expose_headers"`
	// MaxAge is how long a browser may cache a preflight's answer
	// (default 10m), whole seconds.
	MaxAge time.Duration `yaml:"max_age"`
}

// DefaultCORS is the cors section's defaults.
func DefaultCORS() CORS {
	return CORS{AllowedOrigins: []string{"*"}, AllowedMethods: []string{"*"}, AllowedHeaders: []string{"*"}, MaxAge: DefaultCORSMaxAge}
}

// Enabled reports whether the gateway answers CORS.
func (c CORS) Enabled() bool { return len(c.AllowedOrigins) > 0 }

// Validate checks the section.
func (c CORS) Validate() error {
	for i, o := range c.AllowedOrigins {
		field := "cors.allowed_origins[" + strconv.Itoa(i) + "]"
		switch {
		case o == "*", o == "null":
		case !isOrigin(o):
			return invalid(field, o, `is not an origin: scheme://host[:port], with no path, trailing slash or wildcard, or "*"`)
		case strings.ToLower(o) != o:
			// Browsers send Origin in lower case, and it is compared as
			// sent.
			return invalid(field, o, "must be in lower case, as browsers send it")
		case strings.HasPrefix(o, "https://") && strings.HasSuffix(o, ":443"), strings.HasPrefix(o, "http://") && strings.HasSuffix(o, ":80"):
			return invalid(field, o, "names its scheme's default port, which browsers leave out of Origin")
		case !isASCII(o):
			return invalid(field, o, "must name its host in punycode (xn--...), as browsers send it")
		}
	}
	for _, l := range []struct {
		field string
		names []string
	}{{"cors.allowed_methods", c.AllowedMethods}, {"cors.allowed_headers", c.AllowedHeaders}, {"cors.expose_headers", c.ExposeHeaders}} {
		for i, n := range l.names {
			if n != "*" && !httpguts.ValidHeaderFieldName(n) {
				return invalid(l.field+"["+strconv.Itoa(i)+"]", n, `is not a token (letters, digits and !#$%&'*+-.^_`+"`"+`|~) or "*"`)
			}
		}
	}
	for i, m := range c.AllowedMethods {
		// Fetch sends these six in upper case whatever the page wrote,
		// and compares methods as sent.
		if u := strings.ToUpper(m); u != m && slices.Contains([]string{"DELETE", "GET", "HEAD", "OPTIONS", "POST", "PUT"}, u) {
			return invalid("cors.allowed_methods["+strconv.Itoa(i)+"]", m, "must be "+u+", as browsers send it")
		}
	}
	if c.AllowCredentials && slices.Contains(c.ExposeHeaders, "*") {
		return invalid("cors.expose_headers", c.ExposeHeaders, `holds "*", which with allow_credentials names a field called "*", not every field: list them`)
	}
	if c.MaxAge < 0 || c.MaxAge%time.Second != 0 {
		return invalid("cors.max_age", c.MaxAge, "must be whole seconds, not negative (Access-Control-Max-Age counts seconds)")
	}
	return nil
}

func isASCII(s string) bool {
	for i := range len(s) {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// isOrigin reports whether o is a serialized origin as browsers send it
// in Origin: a scheme and a host, maybe a port, nothing else.
func isOrigin(o string) bool {
	u, err := url.Parse(o)
	return err == nil && u.Scheme != "" && u.Host != "" && u.User == nil && u.Path == "" && u.RawQuery == "" &&
		!u.ForceQuery && u.Fragment == "" && !strings.HasSuffix(o, "#") && !strings.Contains(u.Host, "*")
}
