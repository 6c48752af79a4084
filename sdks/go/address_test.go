package composer

import (
	"context"
	"strings"
	"testing"
	"time"
)

// Every address form the docs give works, whether passed to Dial or read
// from COMPOSER_ADDRESS; the URL's scheme decides TLS.
func TestAddressForms(t *testing.T) {
	for _, c := range []struct {
		address, target string
		tls             bool
	}{
		{"127.0.0.1:7070", "127.0.0.1:7070", false},
		{"localhost:7070", "localhost:7070", false},
		{"http://127.0.0.1:7370", "127.0.0.1:7370", false},
		{"HTTP://127.0.0.1:7370/", "127.0.0.1:7370", false},
		{"https://composer.example.com:8443", "composer.example.com:8443", true},
		{"https://composer.example.com", "composer.example.com:443", true},
		{"http://composer.internal", "composer.internal:80", false},
		{"[::1]:7070", "[::1]:7070", false},
		{"http://[::1]:7070", "[::1]:7070", false},
		{" 127.0.0.1:7070 ", "127.0.0.1:7070", false},
	} {
		got, err := parseAddress(c.address, false)
		if err != nil || got.target != c.target || got.tls != c.tls {
			t.Errorf("parseAddress(%q) = %+v, %v; want %s tls=%v", c.address, got, err, c.target, c.tls)
		}
	}
}

// A malformed address fails at once, naming the address and the forms.
func TestBadAddressesFailAtOnce(t *testing.T) {
	for address, why := range map[string]string{
		"127.0.0.1":                 "no port",
		"http://":                   "no host",
		"grpc://127.0.0.1:7070":     "scheme grpc://",
		"dns:///127.0.0.1:7070":     "scheme dns://",
		"127.0.0.1:0":               "not 1-65535",
		"127.0.0.1:99999":           "not 1-65535",
		"127.0.0.1:":                "empty port",
		"http://127.0.0.1:7070/api": "path",
		"http://me:pw@127.0.0.1:1":  "credentials",
		"http://127.0.0.1:x":        "not host:port",
		"   ":                       "empty",
	} {
		start := time.Now()
		_, err := Dial(context.Background(), address)
		if err == nil || !strings.Contains(err.Error(), why) || !strings.Contains(err.Error(), "host:port, http://host:port or https://host:port") {
			t.Errorf("Dial(%q) = %v; want an error saying %q", address, err, why)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("Dial(%q) took %s", address, d)
		}
	}
	if _, err := Dial(context.Background(), "http://127.0.0.1:7070", WithTLS(nil)); err == nil || !strings.Contains(err.Error(), "use https://") {
		t.Errorf("http:// with WithTLS: %v", err)
	}
}

// COMPOSER_ADDRESS in the http:// form the README exports reaches the
// server when Dial gets no address; a bad one is named as COMPOSER_ADDRESS.
func TestDialReadsCOMPOSER_ADDRESSInEveryForm(t *testing.T) {
	_, direct := startFake(t)
	hostPort := direct.Address()
	for _, address := range []string{hostPort, "http://" + hostPort} {
		t.Setenv("COMPOSER_ADDRESS", address)
		client, err := Dial(context.Background(), "", WithToken(""), WithTimeout(5*time.Second))
		if err != nil {
			t.Fatalf("Dial with COMPOSER_ADDRESS=%s: %v", address, err)
		}
		info, err := client.CheckProtocol(context.Background())
		_ = client.Close()
		if err != nil || info.ServerVersion != "fake" {
			t.Errorf("COMPOSER_ADDRESS=%s: %+v, %v", address, info, err)
		}
	}
	t.Setenv("COMPOSER_ADDRESS", "127.0.0.1")
	if _, err := Dial(context.Background(), ""); err == nil || !strings.Contains(err.Error(), `COMPOSER_ADDRESS "127.0.0.1"`) {
		t.Errorf("a bad COMPOSER_ADDRESS: %v", err)
	}
}

// https:// speaks TLS: against a plaintext server the handshake fails
// (UNAVAILABLE within the deadline), where http:// succeeds.
func TestHTTPSAddressSpeaksTLS(t *testing.T) {
	_, direct := startFake(t)
	client, err := Dial(context.Background(), "https://"+direct.Address(), WithToken(""))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = client.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := client.ServerInfo(ctx); err == nil {
		t.Fatal("https:// reached a plaintext server: TLS was not used")
	}
}

// A worker on a Client dialled with the http:// form polls and reports.
func TestWorkerClientWithTheREADMEAddressPolls(t *testing.T) {
	f, direct := startFake(t)
	client, err := Dial(context.Background(), "http://"+direct.Address(), WithToken(""))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = client.Close() }()
	f.add(fakeTask("a", "q", "echo", 3*time.Second, "hi"))
	w := NewWorker(client, WorkerOptions{Slots: 1, PollWait: 200 * time.Millisecond})
	w.Handle("q", "echo", func(ctx context.Context, task *Task) (any, error) { return "ok", nil })
	runWorker(t, w)
	eventually(t, 10*time.Second, "the task to complete", func() bool { return w.Stats().Completed == 1 })
}
