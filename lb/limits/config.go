// Package limits is the gateway's access control and per-client limits:
// client API keys (stored hashed), per-key token buckets for requests and
// tokens per minute and a per-key concurrency cap (Keys), per-IP connection
// caps and an idle limit as a net.Listener wrapper (Listener), and the
// admin listener's guard (AdminGuard). Nothing here knows about pods or
// routing; the gateway asks and acts on the answers.
package limits

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Defaults, as named constants so the docs and the code cannot disagree.
const (
	// DefaultMaxConnsPerIP is 0, no cap: clients behind one NAT or one L4
	// balancer share an address, so a cap is a decision for the operator.
	DefaultMaxConnsPerIP = 0
	// DefaultIdleTimeout cuts a connection on which no byte has moved for
	// two minutes in the direction it is waiting on.
	DefaultIdleTimeout = 2 * time.Minute
)

// Config is the access-control part of the gateway's configuration. It is
// meant to be embedded inline in the gateway's Config, which gives the YAML
// keys api_keys, limits and admin_token at the top level:
//
//	api_keys:
//	  - {name: team-a, sha256: 9f86d0..., requests_per_minute: 600, tokens_per_minute: 200000, max_concurrent: 16}
//	limits: {max_conns_per_ip: 64, idle_timeout: 2m}
//	admin_token: "..."
type Config struct {
	// APIKeys, when not empty, makes every API request carry one of these
	// keys, as "Authorization: Bearer <key>" or, as Anthropic's SDKs send
	// it, "x-api-key: <key>" (default: none, no authentication). A reload
	// changes them (Keys.Reload).
	APIKeys []APIKey `yaml:"api_keys"`
	// Conns bounds client connections.
	Conns ConnLimits `yaml:"limits"`
	// AdminToken, when set, is the bearer token the admin listener requires
	// (default ""). It must be set when the admin listener binds an address
	// that is not loopback, and must not start or end with white space.
	// Compared in constant time.
	AdminToken string `yaml:"admin_token"`
}

// APIKey is one client key and its limits. Each limit 0 means no limit.
type APIKey struct {
	// Name identifies the key in metrics and logs; the key itself is never
	// logged.
	Name string `yaml:"name"`
	// SHA256 is the hex SHA-256 of the key (64 hex digits; see HashKey and
	// `pdlb apikey`). Keys are random tokens of 128 bits or more, so a fast
	// hash is as safe as a slow one against guessing from a leaked config,
	// and a slow one (bcrypt, argon2) would cost tens of milliseconds of CPU
	// per request: a denial of service aimed at the gateway.
	SHA256 string `yaml:"sha256"`
	// RequestsPerMinute caps the requests started per minute (default 0).
	RequestsPerMinute int `yaml:"requests_per_minute"`
	// TokensPerMinute caps prompt plus completion tokens per minute
	// (default 0). The prompt is charged at admission and must fit; the
	// completion is charged when the request ends, and may drive the key
	// into debt that later requests wait out.
	TokensPerMinute int `yaml:"tokens_per_minute"`
	// MaxConcurrent caps the key's requests in flight (default 0).
	MaxConcurrent int `yaml:"max_concurrent"`
}

// ConnLimits bounds client connections, on any front end that accepts
// through a net.Listener (see Listener).
type ConnLimits struct {
	// MaxConnsPerIP caps the open connections from one client address
	// (IPv6 clients by /64, the block one host controls) (default 0, no
	// cap). A connection beyond the cap is answered 429 and closed (a reset
	// on a TLS listener, or when the front end has no lingering slot left).
	MaxConnsPerIP int `yaml:"max_conns_per_ip"`
	// IdleTimeout closes a connection on which a read or a write has made no
	// progress for this long (default 2m; 0 turns it off): a client that
	// sends nothing, or stops reading a stream, is cut.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
}

// DefaultConfig returns every default: no keys, no per-IP cap, the default
// idle timeout, no admin token.
func DefaultConfig() Config {
	return Config{Conns: ConnLimits{MaxConnsPerIP: DefaultMaxConnsPerIP, IdleTimeout: DefaultIdleTimeout}}
}

// ErrInvalid wraps every validation error.
var ErrInvalid = errors.New("limits: invalid")

func invalid(field string, value any, why string) error {
	if s, ok := value.(string); ok {
		value = strconv.Quote(s)
	}
	return fmt.Errorf("%w: %s = %v %s", ErrInvalid, field, value, why)
}

// Validate checks every field. admin is the admin listener's address (""
// when it is off): a non-loopback admin address needs an admin_token.
func (c *Config) Validate(admin string) error {
	names := map[string]int{}
	hashes := map[[sha256.Size]byte]int{}
	for i, k := range c.APIKeys {
		field := fmt.Sprintf("api_keys[%d]", i)
		if k.Name == "" {
			return invalid(field+".name", k.Name, "must not be empty")
		}
		if j, dup := names[k.Name]; dup {
			return invalid(field+".name", k.Name, fmt.Sprintf("is also the name of api_keys[%d]", j))
		}
		names[k.Name] = i
		sum, err := parseDigest(k.SHA256)
		if err != nil {
			return invalid(field+".sha256", k.SHA256, "must be 64 hex digits, the SHA-256 of the key (pdlb apikey prints one)")
		}
		if j, dup := hashes[sum]; dup {
			return invalid(field+".sha256", k.SHA256, fmt.Sprintf("is also the key of api_keys[%d]", j))
		}
		hashes[sum] = i
		for _, l := range []struct {
			name string
			v    int
		}{{"requests_per_minute", k.RequestsPerMinute}, {"tokens_per_minute", k.TokensPerMinute}, {"max_concurrent", k.MaxConcurrent}} {
			if l.v < 0 {
				return invalid(field+"."+l.name, l.v, "must not be negative (0 means no limit)")
			}
		}
	}
	if c.Conns.MaxConnsPerIP < 0 {
		return invalid("limits.max_conns_per_ip", c.Conns.MaxConnsPerIP, "must not be negative (0 means no cap)")
	}
	if c.Conns.IdleTimeout < 0 {
		return invalid("limits.idle_timeout", c.Conns.IdleTimeout.String(), "must not be negative (0 turns it off)")
	}
	if c.AdminToken != strings.TrimSpace(c.AdminToken) {
		// AdminGuard trims the token a client sends, so this one could never
		// match. The value is a secret: not quoted.
		return fmt.Errorf("%w: admin_token has white space at its start or end (a YAML block scalar keeps its final newline)", ErrInvalid)
	}
	if admin != "" && c.AdminToken == "" && !IsLoopback(admin) {
		return invalid("admin_token", "", "must be set when admin ("+strconv.Quote(admin)+") is not a loopback address")
	}
	return nil
}

// NewKey returns a fresh API key: "sk-pdlb-" and 256 random bits in
// base64url, with its digest as api_keys stores it.
func NewKey() (key, digest string, err error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", err
	}
	key = "sk-pdlb-" + base64.RawURLEncoding.EncodeToString(b[:])
	return key, HashKey(key), nil
}

// HashKey returns the hex SHA-256 of an API key, the form api_keys stores.
func HashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

func parseDigest(s string) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	if len(s) != hex.EncodedLen(sha256.Size) {
		return sum, hex.ErrLength
	}
	_, err := hex.Decode(sum[:], []byte(s))
	return sum, err
}

// IsLoopback reports whether the listen address addr (host:port) binds
// only loopback: a loopback IP or "localhost". An empty host binds every
// interface, so it is not loopback.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}
