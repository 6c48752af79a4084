package composer_test

// The harness of the conformance tests (conformance_test.go): the real
// `composer serve` on a fresh database, tokens minted by `composer token`,
// worker child processes, and small helpers.
//
// The tests need COMPOSER_TEST_DATABASE_URL (an admin URL: a database is
// created for the session and dropped after) and COMPOSER_TEST_REDIS_URL,
// as scripts/with-services.sh exports them, and the server binary
// (COMPOSER_BIN, default <repo>/target/debug/composer). Without them the
// conformance tests are skipped, unless COMPOSER_REQUIRE_SERVER=1 makes
// that a failure (scripts/test-go-sdk.sh sets it).

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	composer "github.com/composer-dev/composer/sdks/go"
)

const authSecret = "go-sdk-integration-secret-0123456789abcdef"

var (
	repoRoot, _ = filepath.Abs("../..")
	session     struct {
		once     sync.Once
		err      error
		dbURL    string
		redisURL string
		adminURL string
		dbName   string
		server   *serverProcess
		token    string
		tmp      string
		// secretsKey is the --secrets-key-file of every server of the
		// session: they share a database, whose data keys it wraps.
		secretsKey string
		// blobStore is the --blob-store folder of every server of the
		// session (in tmp): the blobs their shared database refers to.
		blobStore string
	}
)

func composerBin() string {
	if b := os.Getenv("COMPOSER_BIN"); b != "" {
		return b
	}
	return filepath.Join(repoRoot, "target", "debug", "composer")
}

func TestMain(m *testing.M) {
	code := m.Run()
	if session.server != nil {
		session.server.stop()
	}
	if session.dbName != "" {
		_ = exec.Command("psql", session.adminURL, "-q", "-c", fmt.Sprintf(`DROP DATABASE IF EXISTS "%s" WITH (FORCE)`, session.dbName)).Run()
	}
	if session.tmp != "" {
		_ = os.RemoveAll(session.tmp)
	}
	os.Exit(code)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// names is a unique suffix for a test's workflow and queue names.
func names() string { return randomHex(4) }

// services starts the session (database, server, admin token in
// COMPOSER_TOKEN) once, and skips or fails the test when it cannot run.
func services(t *testing.T) {
	t.Helper()
	admin, redis := os.Getenv("COMPOSER_TEST_DATABASE_URL"), os.Getenv("COMPOSER_TEST_REDIS_URL")
	if admin == "" || redis == "" {
		msg := "COMPOSER_TEST_DATABASE_URL and COMPOSER_TEST_REDIS_URL are not set: run through scripts/with-services.sh (scripts/test-go-sdk.sh)"
		if os.Getenv("COMPOSER_REQUIRE_SERVER") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	session.once.Do(func() {
		session.err = startSession(admin, redis)
	})
	if session.err != nil {
		t.Fatalf("the test session did not start: %v", session.err)
	}
	t.Setenv("COMPOSER_TOKEN", session.token)
}

func startSession(admin, redis string) error {
	if _, err := os.Stat(composerBin()); err != nil {
		return fmt.Errorf("%s is missing (set COMPOSER_BIN or build composer-cli): %w", composerBin(), err)
	}
	tmp, err := os.MkdirTemp("", "composer-go-sdk-")
	if err != nil {
		return err
	}
	session.tmp = tmp
	session.adminURL, session.redisURL = admin, redis
	session.secretsKey = filepath.Join(tmp, "secrets-kek.hex")
	// A fresh key-encryption key, as `composer secret new-key` prints one: 64 hex digits.
	if err := os.WriteFile(session.secretsKey, []byte(randomHex(32)+"\n"), 0o600); err != nil {
		return err
	}
	session.blobStore = filepath.Join(tmp, "blobs")
	if err := os.Mkdir(session.blobStore, 0o700); err != nil {
		return err
	}
	name := "composer_sdk_go_" + randomHex(6)
	if out, err := exec.Command("psql", admin, "-v", "ON_ERROR_STOP=1", "-q", "-c", fmt.Sprintf(`CREATE DATABASE "%s"`, name)).CombinedOutput(); err != nil {
		return fmt.Errorf("create database: %v: %s", err, out)
	}
	session.dbName = name
	u, err := url.Parse(admin)
	if err != nil {
		return err
	}
	u.Path = "/" + name
	session.dbURL = u.String()
	token, err := mintToken("go-tests", "default", "admin")
	if err != nil {
		return err
	}
	session.token = token
	session.server = &serverProcess{logPath: filepath.Join(tmp, "server.log")}
	return session.server.start(0)
}

// mintToken makes a token for roles with `composer token`.
func mintToken(subject, namespace string, roles ...string) (string, error) {
	cmd := exec.Command(composerBin(), "token", "--sub", subject, "--ns", namespace, "--role", strings.Join(roles, ","), "--ttl", "2h")
	cmd.Env = append(os.Environ(), "COMPOSER_AUTH_SECRET="+authSecret)
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("composer token: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

func mustToken(t *testing.T, subject string, roles ...string) string {
	t.Helper()
	token, err := mintToken(subject, "default", roles...)
	if err != nil {
		t.Fatal(err)
	}
	return token
}

// serverProcess is one `composer serve`, restartable on its port;
// extraArgs are added to `serve`. It is given blobStore as --blob-store
// (default: the session's folder), and the session's secrets key unless
// noSecretsKey.
type serverProcess struct {
	logPath      string
	extraArgs    []string
	blobStore    string
	noSecretsKey bool
	mu           sync.Mutex
	cmd          *exec.Cmd
	addr         string
	exited       chan struct{}
}

func (s *serverProcess) address() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

func (s *serverProcess) start(port int) error {
	blobStore := s.blobStore
	if blobStore == "" {
		blobStore = session.blobStore
	}
	args := []string{"serve", "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--log-format", "json",
		"--database-url", session.dbURL, "--redis-url", session.redisURL, "--auth-secret", authSecret,
		"--blob-store", blobStore}
	if !s.noSecretsKey {
		args = append(args, "--secrets-key-file", session.secretsKey)
	}
	cmd := exec.Command(composerBin(), append(args, s.extraArgs...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	logFile, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return err
	}
	found := make(chan string, 1)
	exited := make(chan struct{})
	go func() {
		defer logFile.Close()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		sent := false
		for sc.Scan() {
			line := sc.Bytes()
			_, _ = logFile.Write(append(line, '\n'))
			if sent {
				continue
			}
			var rec map[string]any
			if json.Unmarshal(line, &rec) != nil {
				continue
			}
			fields, _ := rec["fields"].(map[string]any)
			if fields == nil {
				fields = rec
			}
			if fields["message"] == "listening" {
				if addr, ok := fields["addr"].(string); ok && addr != "" {
					found <- addr
					sent = true
				}
			}
		}
	}()
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	select {
	case addr := <-found:
		s.mu.Lock()
		s.cmd, s.addr, s.exited = cmd, addr, exited
		s.mu.Unlock()
		return nil
	case <-exited:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
	}
	tail, _ := os.ReadFile(s.logPath)
	if len(tail) > 4000 {
		tail = tail[len(tail)-4000:]
	}
	return fmt.Errorf("the server did not start listening; its log:\n%s", tail)
}

// stop stops the server with SIGTERM (SIGKILL after 30 s).
func (s *serverProcess) stop() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// restart stops the server and starts it again on the same port.
func (s *serverProcess) restart(t *testing.T) {
	t.Helper()
	addr := s.address()
	port := addr[strings.LastIndex(addr, ":")+1:]
	s.stop()
	var p int
	fmt.Sscan(port, &p)
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := s.start(p)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("restart: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// sharedServer is the session's server (tests use names of their own).
func sharedServer(t *testing.T) string {
	t.Helper()
	services(t)
	return session.server.address()
}

// ownServer is a server of the test's own (same database), for tests that
// stop or restart it or need flags of their own (extraArgs, added to `serve`).
func ownServer(t *testing.T, extraArgs ...string) *serverProcess {
	t.Helper()
	services(t)
	s := &serverProcess{logPath: filepath.Join(t.TempDir(), "own-server.log"), extraArgs: extraArgs}
	if err := s.start(0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.stop)
	return s
}

// keylessServer is a server of the test's own (same database) given no
// secrets key.
func keylessServer(t *testing.T) *serverProcess {
	t.Helper()
	services(t)
	s := &serverProcess{logPath: filepath.Join(t.TempDir(), "keyless-server.log"), noSecretsKey: true}
	if err := s.start(0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.stop)
	return s
}

func dial(t *testing.T, addr string, opts ...composer.Option) *composer.Client {
	t.Helper()
	c, err := composer.Dial(context.Background(), addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// testContext is a context that ends with the test's budget.
func testContext(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// serve runs w in the background; the returned stop ends Run and waits for it.
func serve(t *testing.T, w *composer.Worker) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Worker.Run: %v", err)
				}
			case <-time.After(60 * time.Second):
				t.Error("the worker did not stop within 60 s")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func until(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s not reached within %s", what, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// fast is the test workers' options base: short polls, quick back-off.
func fast(slots int) composer.WorkerOptions {
	return composer.WorkerOptions{
		Slots: slots, PollWait: 2 * time.Second, DrainTimeout: 20 * time.Second,
		Backoff: composer.Backoff{Initial: 50 * time.Millisecond, Max: time.Second, Multiplier: 2, Jitter: 0.5},
	}
}

// oneTask is a workflow of one TASK node "work" (extra is YAML added to the node).
func oneTask(name, queue, task, extra string) composer.Source {
	var b strings.Builder
	fmt.Fprintf(&b, "name: %s\nnodes:\n  - id: work\n    type: TASK\n    queue: %s\n    task: %s\n", name, queue, task)
	for line := range strings.SplitSeq(strings.TrimSpace(extra), "\n") {
		if strings.TrimSpace(line) != "" {
			fmt.Fprintf(&b, "    %s\n", line)
		}
	}
	b.WriteString("output: { result: \"${nodes.work.output}\" }\n")
	return composer.YAML([]byte(b.String()))
}

func historyTypes(t *testing.T, c *composer.Client, runID string) []string {
	t.Helper()
	var types []string
	for e, err := range c.History(testContext(t, 30*time.Second), runID) {
		if err != nil {
			t.Fatal(err)
		}
		types = append(types, e.EventType)
	}
	return types
}

func finalRun(t *testing.T, c *composer.Client, runID string, timeout time.Duration) *composer.Run {
	t.Helper()
	run, err := c.WaitForRun(testContext(t, timeout), runID)
	if err != nil {
		t.Fatalf("waiting for run %s: %v", runID, err)
	}
	return run
}

// --- worker child processes -------------------------------------------------

var testworker struct {
	once sync.Once
	path string
	err  error
}

// testworkerBinary builds internal/testworker once per session.
func testworkerBinary(t *testing.T) string {
	t.Helper()
	testworker.once.Do(func() {
		dir := session.tmp
		if dir == "" {
			dir = os.TempDir()
		}
		testworker.path = filepath.Join(dir, "testworker")
		out, err := exec.Command("go", "build", "-o", testworker.path, "./internal/testworker").CombinedOutput()
		if err != nil {
			testworker.err = fmt.Errorf("go build ./internal/testworker: %v: %s", err, out)
		}
	})
	if testworker.err != nil {
		t.Fatal(testworker.err)
	}
	return testworker.path
}

// workerProcess is internal/testworker in a child process, its JSON lines collected.
type workerProcess struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	events []map[string]any
	lines  []string
	exited chan struct{}
	err    error
}

func startWorkerProcess(t *testing.T, addr, queue string, slots int, seconds, drain float64) *workerProcess {
	t.Helper()
	cmd := exec.Command(testworkerBinary(t), addr, queue, fmt.Sprint(slots), fmt.Sprint(seconds), fmt.Sprint(drain))
	cmd.Env = os.Environ()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	p := &workerProcess{cmd: cmd, exited: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			var ev map[string]any
			p.mu.Lock()
			p.lines = append(p.lines, line)
			if json.Unmarshal([]byte(line), &ev) == nil && ev["event"] != nil {
				p.events = append(p.events, ev)
			}
			p.mu.Unlock()
		}
	}()
	go func() {
		<-read
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(p.kill)
	return p
}

func (p *workerProcess) seen(event string) []map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []map[string]any
	for _, ev := range p.events {
		if ev["event"] == event {
			out = append(out, ev)
		}
	}
	return out
}

func (p *workerProcess) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := strings.Join(p.lines, "\n")
	if len(s) > 4000 {
		s = s[len(s)-4000:]
	}
	return s
}

func (p *workerProcess) waitFor(t *testing.T, event string, count int, timeout time.Duration) []map[string]any {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if got := p.seen(event); len(got) >= count {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d x %q not seen within %s; worker output:\n%s", count, event, timeout, p.output())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// wait waits for the process to exit and returns its exit code.
func (p *workerProcess) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(timeout):
		t.Fatalf("the worker process did not exit within %s; output:\n%s", timeout, p.output())
	}
	return p.cmd.ProcessState.ExitCode()
}

func (p *workerProcess) kill() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
}
