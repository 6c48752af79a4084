package composer

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// addressForms lists the forms a server address may take, for error messages.
const addressForms = "host:port, http://host:port or https://host:port"

// schemePrefix matches a URL scheme with its "://".
var schemePrefix = regexp.MustCompile(`^([a-zA-Z][a-zA-Z0-9+.-]*)://`)

// serverAddress is a checked server address: the gRPC target (host:port)
// and whether the address asked for TLS (https://).
type serverAddress struct {
	target string
	tls    bool
}

// parseAddress checks a server address: `host:port` (plaintext unless
// WithTLS), `http://host:port` (plaintext) or `https://host:port` (TLS; the
// system's roots unless WithTLS gives a config). A URL may leave the port
// out for 80 / 443. A host is a name, an IPv4 address or a bracketed IPv6
// address. Anything else (no port, a bad port, another scheme, a path, a
// query, credentials) is an error naming the address and where it came
// from, so a typo fails at Dial rather than as a connection that never comes.
func parseAddress(address string, withTLS bool) (serverAddress, error) {
	where := ""
	if address == os.Getenv("COMPOSER_ADDRESS") {
		where = "COMPOSER_ADDRESS "
	}
	bad := func(why string) error {
		return fmt.Errorf("composer: invalid server address %s%q: %s; expected %s", where, address, why, addressForms)
	}
	text := strings.TrimSpace(address)
	if text == "" {
		return serverAddress{}, bad("it is empty")
	}
	scheme := ""
	if m := schemePrefix.FindStringSubmatch(text); m != nil {
		scheme = strings.ToLower(m[1])
		if scheme != "http" && scheme != "https" {
			return serverAddress{}, bad(fmt.Sprintf("the scheme %s:// is not http:// or https://", scheme))
		}
		if scheme == "http" && withTLS {
			return serverAddress{}, bad("http:// with WithTLS: use https:// (or host:port with WithTLS)")
		}
	}
	withScheme := text
	if scheme == "" {
		withScheme = "http://" + text
	}
	u, err := url.Parse(withScheme)
	if err != nil {
		return serverAddress{}, bad("it is not host:port")
	}
	if u.User != nil {
		return serverAddress{}, bad("it carries credentials (pass the token with WithToken or COMPOSER_TOKEN)")
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" || u.ForceQuery {
		return serverAddress{}, bad("it has a path, query or fragment")
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		return serverAddress{}, bad("it names no host")
	}
	if strings.HasSuffix(u.Host, ":") {
		return serverAddress{}, bad("it has an empty port")
	}
	if port == "" {
		if scheme == "" {
			return serverAddress{}, bad("it has no port")
		}
		port = map[string]string{"http": "80", "https": "443"}[scheme]
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return serverAddress{}, bad(fmt.Sprintf("the port %q is not 1-65535", port))
	}
	return serverAddress{target: net.JoinHostPort(host, port), tls: scheme == "https"}, nil
}
