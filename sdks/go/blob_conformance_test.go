package composer_test

// C23 (tests/conformance/README.md): large payloads move through the blob
// store, unseen by handlers. The harness gives every server of the session
// one --blob-store folder under its temporary directory.

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	composer "github.com/composer-dev/composer/sdks/go"
)

// countUploads is a dial option counting the uploads a client makes:
// UploadBlob streams, and FinishBlobUpload calls where the server gives
// presigned URLs (C24).
func countUploads(n *atomic.Int32) composer.Option {
	return composer.WithDialOptions(grpc.WithChainStreamInterceptor(
		func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			if strings.HasSuffix(method, "/UploadBlob") {
				n.Add(1)
			}
			return streamer(ctx, desc, cc, method, opts...)
		}), grpc.WithChainUnaryInterceptor(
		func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if strings.HasSuffix(method, "/FinishBlobUpload") {
				n.Add(1)
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}))
}

// doc is the payload's shape in these tests.
type doc struct {
	Doc string `json:"doc"`
	N   int    `json:"n"`
}

// jsonEqual reports whether two JSON texts hold the same value.
func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("not JSON: %.200s: %v", a, err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatalf("not JSON: %.200s: %v", b, err)
	}
	return reflect.DeepEqual(x, y)
}

// reference reads a value shown as stored as a reference, failing the
// test unless it is one whose size is over minSize and whose head starts
// with {"doc".
func reference(t *testing.T, what string, value json.RawMessage, minSize int64) composer.BlobRef {
	t.Helper()
	ref, ok := composer.ParseBlobRef(value)
	if !ok {
		t.Fatalf("%s is not a reference: %.200s", what, value)
	}
	if ref.Size <= minSize || !strings.HasPrefix(ref.Head, `{"doc"`) {
		t.Errorf("%s: reference %+v, want a size over %d and a head starting with {\"doc\"", what, ref, minSize)
	}
	return ref
}

// A run of a → b started with a 150 KB input: each handler sees whole
// values, the result is resolved, GetRun shows references, DownloadBlob
// gives the input back in its namespace only, and a small input stays
// inline.
func TestC23LargePayloadsMoveThroughTheBlobStoreUnseenByHandlers(t *testing.T) {
	largePayloadRun(t, sharedServer(t))
}

// largePayloadRun is C23's run of a → b against the server at addr.
func largePayloadRun(t *testing.T, addr string) {
	n := names()
	ctx := testContext(t, 180*time.Second)
	var clientUploads, workerUploads atomic.Int32
	client := dial(t, addr, countUploads(&clientUploads))
	workerClient := dial(t, addr, countUploads(&workerUploads))

	info, err := client.ServerInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.PayloadOffloadBytes <= 0 || info.PayloadOffloadBytes >= 150_000 {
		t.Fatalf("payload_offload_bytes is %d: this test needs a threshold under 150,000 (64 KiB by default)", info.PayloadOffloadBytes)
	}

	queue := "payloads-" + n
	workflow := "payloads-" + n
	source := fmt.Sprintf(`
name: %[1]s
description: conformance C23
nodes:
  - { id: a, type: TASK, queue: %[2]s, task: grow, input: "${input}" }
  - { id: b, type: TASK, queue: %[2]s, task: measure, input: "${nodes.a.output}" }
edges:
  - { from: a, to: b }
output: { a: "${size(nodes.a.output.doc)}", b: "${nodes.b.output}" }
`, workflow, queue)
	if _, err := client.RegisterWorkflow(ctx, composer.YAML([]byte(source))); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	seen := map[string][]string{} // task name -> the inputs its handler saw
	record := func(task *composer.Task) {
		mu.Lock()
		defer mu.Unlock()
		seen[task.Name] = append(seen[task.Name], string(task.Input))
	}
	w := composer.NewWorker(workerClient, fast(2))
	w.Handle(queue, "grow", composer.Typed(func(ctx context.Context, in doc) (doc, error) {
		record(composer.TaskFromContext(ctx))
		return doc{Doc: strings.Repeat("b", 200_000), N: in.N}, nil
	}))
	w.Handle(queue, "measure", composer.Typed(func(ctx context.Context, in doc) (int, error) {
		record(composer.TaskFromContext(ctx))
		return len(in.Doc), nil
	}))
	serve(t, w)

	input := doc{Doc: strings.Repeat(n, 150_000/len(n)), N: 7}
	inputJSON, _ := json.Marshal(input)
	started, err := client.StartRun(ctx, workflow, input)
	if err != nil {
		t.Fatal(err)
	}
	if got := clientUploads.Load(); got != 1 {
		t.Errorf("StartRun made %d uploads, want 1", got)
	}
	var result map[string]int
	if err := client.WaitForResult(ctx, started.ID, &result); err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"a": 200_000, "b": 200_000}; !reflect.DeepEqual(result, want) {
		t.Errorf("result %v, want %v", result, want)
	}

	// The handlers saw whole values, never a reference.
	mu.Lock()
	grew, measured := seen["grow"], seen["measure"]
	mu.Unlock()
	if len(grew) != 1 || !jsonEqual(t, []byte(grew[0]), inputJSON) {
		t.Errorf("a saw %d inputs, the first %.200s", len(grew), grew)
	}
	wantB, _ := json.Marshal(doc{Doc: strings.Repeat("b", 200_000), N: 7})
	if len(measured) != 1 || !jsonEqual(t, []byte(measured[0]), wantB) {
		t.Errorf("b saw %d inputs, the first %.200s", len(measured), measured)
	}
	// a's output went up from the worker; b's (a number) went inline.
	if got := workerUploads.Load(); got != 1 {
		t.Errorf("the worker made %d uploads, want 1 (a's output)", got)
	}

	// GetRun shows the references as stored.
	run, err := client.GetRun(ctx, started.ID)
	if err != nil {
		t.Fatal(err)
	}
	inputRef := reference(t, "the run's input", run.Input, 150_000)
	if a := run.Node("a"); a == nil {
		t.Error("the run has no node a")
	} else {
		reference(t, "a's output", a.Output, 150_000)
	}
	if !jsonEqual(t, run.Output, []byte(`{"a":200000,"b":200000}`)) {
		t.Errorf("the run's output as stored: %.200s", run.Output)
	}

	// The input's blob holds the input's JSON; ResolvePayload reads it too.
	data, err := client.DownloadBlob(ctx, inputRef.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(data)) != inputRef.Size || !jsonEqual(t, data, inputJSON) {
		t.Errorf("the input's blob: %d bytes (reference says %d), %.100s", len(data), inputRef.Size, data)
	}
	resolved, err := client.ResolvePayload(ctx, run.Input)
	if err != nil {
		t.Fatal(err)
	}
	if !jsonEqual(t, resolved, inputJSON) {
		t.Errorf("ResolvePayload of the input: %.100s", resolved)
	}

	// Another namespace does not find the blob.
	otherToken, err := mintToken("go-tests", "other-"+n, "admin")
	if err != nil {
		t.Fatal(err)
	}
	other := dial(t, addr, composer.WithToken(otherToken))
	if _, err := other.DownloadBlob(ctx, inputRef.SHA256); !composer.IsNotFound(err) {
		t.Errorf("another namespace's download: %v, want NOT_FOUND", err)
	}

	// A small input stays inline.
	small, err := client.StartRun(ctx, workflow, doc{Doc: "small", N: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got := clientUploads.Load(); got != 1 {
		t.Errorf("a small input was uploaded (%d uploads in all)", got)
	}
	smallRun, err := client.GetRun(ctx, small.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, isRef := composer.ParseBlobRef(smallRun.Input); isRef || !jsonEqual(t, smallRun.Input, []byte(`{"doc":"small","n":1}`)) {
		t.Errorf("the small input as stored: %s", smallRun.Input)
	}
	if err := client.WaitForResult(ctx, small.ID, &result); err != nil {
		t.Fatal(err)
	}
}

// An event payload over the threshold goes up with SendEvent and reaches
// the waiting node as a reference, which a worker resolves for its handler
// and an expression reads.
func TestC23AnEventPayloadOverTheThresholdTravelsAsAReference(t *testing.T) {
	largeEventPayload(t, sharedServer(t))
}

// largeEventPayload is C23's event payload over the threshold, against the
// server at addr.
func largeEventPayload(t *testing.T, addr string) {
	n := names()
	ctx := testContext(t, 120*time.Second)
	var clientUploads atomic.Int32
	client := dial(t, addr, countUploads(&clientUploads))
	queue, workflow := "event-payloads-"+n, "event-payloads-"+n
	source := fmt.Sprintf(`
name: %[1]s
nodes:
  - { id: go, type: WAIT_FOR_EVENT, event: go }
  - { id: measure, type: TASK, queue: %[2]s, task: measure, input: "${nodes.go.output}" }
edges:
  - { from: go, to: measure }
output: { size: "${size(nodes.go.output.doc)}", measured: "${nodes.measure.output}" }
`, workflow, queue)
	if _, err := client.RegisterWorkflow(ctx, composer.YAML([]byte(source))); err != nil {
		t.Fatal(err)
	}
	w := composer.NewWorker(dial(t, addr), fast(1))
	w.Handle(queue, "measure", composer.Typed(func(ctx context.Context, in doc) (int, error) {
		return len(in.Doc) + in.N, nil
	}))
	serve(t, w)

	run, err := client.StartRun(ctx, workflow, nil)
	if err != nil {
		t.Fatal(err)
	}
	payload := doc{Doc: strings.Repeat("e", 100_000), N: 3}
	if _, err := client.SendEvent(ctx, composer.Event{Name: "go", RunID: run.ID, Payload: payload}); err != nil {
		t.Fatal(err)
	}
	if got := clientUploads.Load(); got != 1 {
		t.Errorf("StartRun and SendEvent made %d uploads, want 1 (the payload)", got)
	}
	var result map[string]int
	if err := client.WaitForResult(ctx, run.ID, &result); err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"size": 100_000, "measured": 100_003}; !reflect.DeepEqual(result, want) {
		t.Errorf("result %v, want %v", result, want)
	}
	done, err := client.GetRun(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if node := done.Node("go"); node == nil {
		t.Error("the run has no node go")
	} else {
		reference(t, "the event's payload", node.Output, 100_000)
	}
}
