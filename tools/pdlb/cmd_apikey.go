package main

import (
	"fmt"
	"io"

	"pdlb/lb/limits"
)

// cmdAPIKey prints a new client API key and the api_keys entry that admits
// it; only the entry (the key's SHA-256) goes into the config file.
func cmdAPIKey(args []string, stdout io.Writer) error {
	fs := newFlagSet("apikey", "[--name NAME]",
		"Prints a new random client API key, and the api_keys entry of the gateway's\nconfig that admits it. The config holds only the key's SHA-256; give the key to\nthe client, which sends it as Authorization: Bearer KEY (or x-api-key: KEY).", stdout)
	name := fs.String("name", "client", "the key's name in metrics and logs")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fs.usageError(fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	key, digest, err := limits.NewKey()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "key: %s\n\napi_keys:\n  - {name: %q, sha256: %s, requests_per_minute: 0, tokens_per_minute: 0, max_concurrent: 0}\n", key, *name, digest)
	return nil
}
