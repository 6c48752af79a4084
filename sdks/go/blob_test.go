package composer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	pb "github.com/composer-dev/composer/sdks/go/gen/composer/v1"
)

// fakeBlobs is a BlobService that keeps blobs in memory by SHA-256, records
// the chunk sizes of each upload and the offsets of each download, and
// answers as the server does: a chunk over 1 MiB or bytes that are not
// JSON INVALID_ARGUMENT, an unknown digest NOT_FOUND.
type fakeBlobs struct {
	pb.UnimplementedBlobServiceServer

	mu        sync.Mutex
	blobs     map[string][]byte
	uploads   [][]int
	downloads []pb.DownloadBlobRequest
	// breakAfter, when > 0, breaks the next download with UNAVAILABLE after
	// that many chunks.
	breakAfter int
	// tooLarge refuses uploads longer than it (RESOURCE_EXHAUSTED).
	tooLarge int
	// refuse, when set, is asked (under mu) about each upload once its
	// bytes are in: a non-nil error refuses it.
	refuse func() error
	// refuseDownload, when set, is asked (under mu) about each download
	// before it starts: a non-nil error refuses it.
	refuseDownload func() error

	// The presigned URLs (C24): urlBase is where the URLs point
	// (serveURLs' HTTP server, or a closed port); refuseURLs makes every
	// URL call answer FAILED_PRECONDITION; urlCalls records the URL calls
	// by method; staged holds the bytes PUT to each upload; puts and gets
	// record the HTTP requests; failHTTP makes them answer 403.
	urlBase    string
	refuseURLs bool
	urlCalls   []string
	staged     map[string][]byte
	nextUpload int
	puts       []httpRecord
	gets       []httpRecord
	failHTTP   bool
}

// httpRecord is one HTTP request to a fake presigned URL.
type httpRecord struct {
	path          string
	contentLength int64
}

// urlSecret is in the query of every fake URL, as a signature is: it must
// never be logged.
const urlSecret = "X-Amz-Signature=s3cr3t0123456789"

func newFakeBlobs() *fakeBlobs {
	return &fakeBlobs{blobs: map[string][]byte{}, staged: map[string][]byte{}}
}

// urlCall records a URL call and answers FAILED_PRECONDITION when URLs
// are refused; it returns the URLs' base otherwise. Under mu.
func (f *fakeBlobs) urlCall(method string) (string, error) {
	f.urlCalls = append(f.urlCalls, method)
	if f.refuseURLs {
		return "", status.Error(codes.FailedPrecondition, "the blob store does not presign URLs (a local folder)")
	}
	return f.urlBase, nil
}

func (f *fakeBlobs) GetBlobUrl(_ context.Context, req *pb.GetBlobUrlRequest) (*pb.GetBlobUrlResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	base, err := f.urlCall("GetBlobUrl")
	if err != nil {
		return nil, err
	}
	data, ok := f.blobs[req.GetSha256()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no blob %s", req.GetSha256())
	}
	return &pb.GetBlobUrlResponse{Url: base + "/blobs/" + req.GetSha256() + "?" + urlSecret, Size: int64(len(data))}, nil
}

func (f *fakeBlobs) StartBlobUpload(context.Context, *pb.StartBlobUploadRequest) (*pb.StartBlobUploadResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	base, err := f.urlCall("StartBlobUpload")
	if err != nil {
		return nil, err
	}
	f.nextUpload++
	id := "upload-" + strconv.Itoa(f.nextUpload)
	return &pb.StartBlobUploadResponse{UploadId: id, Url: base + "/uploads/" + id + "?" + urlSecret}, nil
}

func (f *fakeBlobs) FinishBlobUpload(_ context.Context, req *pb.FinishBlobUploadRequest) (*pb.FinishBlobUploadResponse, error) {
	f.mu.Lock()
	if _, err := f.urlCall("FinishBlobUpload"); err != nil {
		f.mu.Unlock()
		return nil, err
	}
	data, ok := f.staged[req.GetUploadId()]
	delete(f.staged, req.GetUploadId())
	tooLarge := f.tooLarge
	f.mu.Unlock()
	switch {
	case !ok:
		return nil, status.Errorf(codes.NotFound, "no upload %s", req.GetUploadId())
	case tooLarge > 0 && len(data) > tooLarge:
		return nil, status.Errorf(codes.ResourceExhausted, "a payload of %d bytes exceeds the %d bytes limit", len(data), tooLarge)
	case !json.Valid(data):
		return nil, status.Error(codes.InvalidArgument, "data: not JSON")
	}
	ref := f.put(data)
	return &pb.FinishBlobUploadResponse{Blob: &pb.BlobRef{Sha256: ref.SHA256, Size: ref.Size, Head: ref.Head}}, nil
}

// ServeHTTP is the blob store behind the fake URLs: a PUT to
// /uploads/<id> stages an upload's bytes, a GET of /blobs/<sha256> reads a
// blob. A request without the signature is refused.
func (f *fakeBlobs) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	record := httpRecord{path: r.URL.Path, contentLength: r.ContentLength}
	if r.Method == http.MethodPut {
		f.puts = append(f.puts, record)
	} else {
		f.gets = append(f.gets, record)
	}
	if f.failHTTP || r.URL.RawQuery != urlSecret {
		http.Error(w, "SignatureDoesNotMatch", http.StatusForbidden)
		return
	}
	switch {
	case r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, "/uploads/"):
		f.staged[strings.TrimPrefix(r.URL.Path, "/uploads/")] = body
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/blobs/"):
		data, ok := f.blobs[strings.TrimPrefix(r.URL.Path, "/blobs/")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(data)
	default:
		http.Error(w, "no such route", http.StatusMethodNotAllowed)
	}
}

// serveURLs makes the fake server give presigned URLs served by an HTTP
// server of the test's.
func serveURLs(t *testing.T, f *fakeServer) {
	t.Helper()
	store := httptest.NewServer(f.blobs)
	t.Cleanup(store.Close)
	f.mu.Lock()
	f.blobURLs = true
	f.mu.Unlock()
	f.blobs.mu.Lock()
	f.blobs.urlBase = store.URL
	f.blobs.mu.Unlock()
}

// urlRecords copies the URL calls and HTTP requests under the lock.
func (f *fakeBlobs) urlRecords() (calls []string, puts, gets []httpRecord) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.urlCalls...), append([]httpRecord(nil), f.puts...), append([]httpRecord(nil), f.gets...)
}

func digest(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// put stores data as a blob and returns its reference.
func (f *fakeBlobs) put(data []byte) BlobRef {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.blobs[digest(data)] = append([]byte(nil), data...)
	return BlobRef{SHA256: digest(data), Size: int64(len(data)), Head: string(data[:min(len(data), 256)])}
}

func (f *fakeBlobs) get(sha string) []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.blobs[sha]
}

func (f *fakeBlobs) UploadBlob(stream grpc.ClientStreamingServer[pb.UploadBlobRequest, pb.UploadBlobResponse]) error {
	var data []byte
	var sizes []int
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if len(msg.GetData()) > BlobChunkSize {
			return status.Errorf(codes.InvalidArgument, "data: a chunk of %d bytes", len(msg.GetData()))
		}
		sizes = append(sizes, len(msg.GetData()))
		data = append(data, msg.GetData()...)
	}
	f.mu.Lock()
	f.uploads = append(f.uploads, sizes)
	tooLarge := f.tooLarge
	var refused error
	if f.refuse != nil {
		refused = f.refuse()
	}
	f.mu.Unlock()
	if refused != nil {
		return refused
	}
	if tooLarge > 0 && len(data) > tooLarge {
		return status.Errorf(codes.ResourceExhausted, "a payload of %d bytes exceeds the %d bytes limit", len(data), tooLarge)
	}
	if !json.Valid(data) {
		return status.Error(codes.InvalidArgument, "data: not JSON")
	}
	ref := f.put(data)
	return stream.SendAndClose(&pb.UploadBlobResponse{Blob: &pb.BlobRef{Sha256: ref.SHA256, Size: ref.Size, Head: ref.Head}})
}

func (f *fakeBlobs) DownloadBlob(req *pb.DownloadBlobRequest, stream grpc.ServerStreamingServer[pb.DownloadBlobResponse]) error {
	f.mu.Lock()
	f.downloads = append(f.downloads, pb.DownloadBlobRequest{Sha256: req.GetSha256(), Offset: req.GetOffset()})
	data, ok := f.blobs[req.GetSha256()]
	breakAfter := f.breakAfter
	f.breakAfter = 0
	var refused error
	if f.refuseDownload != nil {
		refused = f.refuseDownload()
	}
	f.mu.Unlock()
	if refused != nil {
		return refused
	}
	if !ok {
		return status.Errorf(codes.NotFound, "no blob %s", req.GetSha256())
	}
	size := int64(len(data))
	for i, chunk := range chunks(data[req.GetOffset():], BlobChunkSize) {
		if breakAfter > 0 && i == breakAfter {
			return status.Error(codes.Unavailable, "fake: the stream broke")
		}
		if err := stream.Send(&pb.DownloadBlobResponse{Data: chunk, Size: size}); err != nil {
			return err
		}
		size = 0
	}
	return nil
}

func (f *fakeBlobs) recorded() (uploads [][]int, downloads []pb.DownloadBlobRequest) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]int(nil), f.uploads...), append([]pb.DownloadBlobRequest(nil), f.downloads...)
}

// fakeBlobRuns is a RunService that records StartRun and SendEvent, and
// answers GetRun and WatchRun with run, for the client's offloading tests.
type fakeBlobRuns struct {
	pb.UnimplementedRunServiceServer

	mu     sync.Mutex
	starts []*pb.StartRunRequest
	events []*pb.SendEventRequest
	run    *pb.Run
}

func (f *fakeBlobRuns) StartRun(_ context.Context, req *pb.StartRunRequest) (*pb.StartRunResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.starts = append(f.starts, req)
	return &pb.StartRunResponse{Run: &pb.Run{RunId: "r1", Input: req.GetInput()}, Created: true}, nil
}

func (f *fakeBlobRuns) SendEvent(_ context.Context, req *pb.SendEventRequest) (*pb.SendEventResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, req)
	return &pb.SendEventResponse{Stored: true}, nil
}

func (f *fakeBlobRuns) GetRun(context.Context, *pb.GetRunRequest) (*pb.GetRunResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &pb.GetRunResponse{Run: f.run}, nil
}

func (f *fakeBlobRuns) WatchRun(_ *pb.WatchRunRequest, stream grpc.ServerStreamingServer[pb.WatchRunResponse]) error {
	f.mu.Lock()
	run := f.run
	f.mu.Unlock()
	return stream.Send(&pb.WatchRunResponse{Run: run})
}

func mustValue(t *testing.T, raw string) *structpb.Value {
	t.Helper()
	v, err := toValue(json.RawMessage(raw))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func sameJSON(t *testing.T, got, want []byte) bool {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("%s: %v", got, err)
	}
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatalf("%s: %v", want, err)
	}
	return reflect.DeepEqual(g, w)
}

func TestChunksCutAtTheSizeAndKeepEveryByte(t *testing.T) {
	data := bytes.Repeat([]byte("abc"), 7)
	got := chunks(data, 5)
	if len(got) != 5 || len(got[0]) != 5 || len(got[4]) != 1 || !bytes.Equal(bytes.Join(got, nil), data) {
		t.Errorf("chunks = %q", got)
	}
	if got := chunks(nil, 5); len(got) != 0 {
		t.Errorf("chunks of nothing = %q", got)
	}
	if got := chunks(data[:5], 5); len(got) != 1 {
		t.Errorf("chunks of exactly one size = %q", got)
	}
}

// UploadBlob sends chunks of at most 1 MiB and returns the server's
// reference; a refusal comes back as the server's *Error.
func TestUploadBlobStreamsChunksOfOneMiB(t *testing.T) {
	f, client := startFake(t)
	ctx := context.Background()
	data := []byte(`"` + strings.Repeat("x", 2*BlobChunkSize+BlobChunkSize/2) + `"`)
	ref, err := client.UploadBlob(ctx, data)
	if err != nil {
		t.Fatal(err)
	}
	if ref.SHA256 != digest(data) || ref.Size != int64(len(data)) || !strings.HasPrefix(ref.Head, `"xxx`) {
		t.Errorf("ref %+v", ref)
	}
	if !bytes.Equal(f.blobs.get(ref.SHA256), data) {
		t.Error("the stored blob differs from the bytes uploaded")
	}
	uploads, _ := f.blobs.recorded()
	if want := []int{BlobChunkSize, BlobChunkSize, BlobChunkSize/2 + 2}; len(uploads) != 1 || !reflect.DeepEqual(uploads[0], want) {
		t.Errorf("chunks %v, want %v", uploads, want)
	}
	if _, err := client.UploadBlob(ctx, []byte("not json")); !IsInvalidArgument(err) {
		t.Errorf("not JSON: %v, want INVALID_ARGUMENT", err)
	}
	var ref2 json.RawMessage = ref.Reference()
	back, ok := ParseBlobRef(ref2)
	if !ok || back != ref {
		t.Errorf("ParseBlobRef(%s) = %+v, %v", ref2, back, ok)
	}
}

// DownloadBlob resumes a broken stream from where it stopped, checks the
// digest, and passes NOT_FOUND on; a malformed digest is refused before
// any call.
func TestDownloadBlobResumesAndChecksTheBytes(t *testing.T) {
	f, client := startFake(t)
	ctx := context.Background()
	data := []byte(`"` + strings.Repeat("y", 2*BlobChunkSize+10) + `"`)
	ref := f.blobs.put(data)
	f.blobs.mu.Lock()
	f.blobs.breakAfter = 1
	f.blobs.mu.Unlock()
	got, err := client.DownloadBlob(ctx, ref.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Errorf("downloaded %d bytes, want %d", len(got), len(data))
	}
	_, downloads := f.blobs.recorded()
	if len(downloads) != 2 || downloads[0].GetOffset() != 0 || downloads[1].GetOffset() != BlobChunkSize {
		t.Errorf("downloads %v, want offsets 0 then %d", downloads, BlobChunkSize)
	}

	// Bytes that are not what the digest names.
	f.blobs.mu.Lock()
	f.blobs.blobs[ref.SHA256] = []byte(`"tampered"`)
	f.blobs.mu.Unlock()
	if _, err := client.DownloadBlob(ctx, ref.SHA256); Code(err) != codes.DataLoss {
		t.Errorf("tampered bytes: %v, want DATA_LOSS", err)
	}
	if _, err := client.DownloadBlob(ctx, strings.Repeat("0", 64)); !IsNotFound(err) {
		t.Errorf("unknown blob: %v, want NOT_FOUND", err)
	}
	before := len(downloads) + 2
	e, ok := AsError(func() error { _, err := client.DownloadBlob(ctx, "ABC"); return err }())
	if !ok || e.Code != codes.InvalidArgument || len(e.FieldViolations) != 1 || e.FieldViolations[0].Field != "sha256" {
		t.Errorf("a malformed digest: %v", e)
	}
	if _, downloads := f.blobs.recorded(); len(downloads) != before {
		t.Errorf("a malformed digest was sent: %d downloads, want %d", len(downloads), before)
	}
}

// ResolvePayload replaces references at any depth (inside downloaded blobs
// too), downloads each blob once, and leaves objects that merely have a
// "$blob" key among others alone.
func TestResolvePayloadReplacesEveryReferenceOnce(t *testing.T) {
	f, client := startFake(t)
	ctx := context.Background()
	doc := f.blobs.put([]byte(`{"doc":"` + strings.Repeat("d", 1000) + `","n":7}`))
	outer := f.blobs.put([]byte(`{"inner":` + string(doc.Reference()) + `}`))
	value := json.RawMessage(`{"a":` + string(doc.Reference()) + `,"list":[1,` + string(doc.Reference()) + `,{"deep":` + string(outer.Reference()) + `}],` +
		`"not":{"$blob":{"sha256":"x"},"other":1},"plain":"text"}`)
	got, err := client.ResolvePayload(ctx, value)
	if err != nil {
		t.Fatal(err)
	}
	docJSON := `{"doc":"` + strings.Repeat("d", 1000) + `","n":7}`
	want := `{"a":` + docJSON + `,"list":[1,` + docJSON + `,{"deep":{"inner":` + docJSON + `}}],"not":{"$blob":{"sha256":"x"},"other":1},"plain":"text"}`
	if !sameJSON(t, got, []byte(want)) {
		t.Errorf("resolved %.300s", got)
	}
	_, downloads := f.blobs.recorded()
	if len(downloads) != 2 {
		t.Errorf("%d downloads, want one per blob (2): %v", len(downloads), downloads)
	}

	plain := json.RawMessage(`{"x": [1, 2, {"y": "z"}]}`)
	if got, err := client.ResolvePayload(ctx, plain); err != nil || !bytes.Equal(got, plain) {
		t.Errorf("a value without references: %s, %v", got, err)
	}
	if got, err := client.ResolvePayload(ctx, nil); err != nil || got != nil {
		t.Errorf("no value: %s, %v", got, err)
	}
	bad := json.RawMessage(`{"a":[0,{"$blob":"nope"}]}`)
	_, err = client.ResolvePayload(ctx, bad)
	if e, ok := AsError(err); !ok || e.Code != codes.InvalidArgument || e.FieldViolations[0].Field != "value.a[1]" {
		t.Errorf("a malformed reference: %v", err)
	}
	missing := BlobRef{SHA256: strings.Repeat("a", 64), Size: 3, Head: "abc"}
	if _, err := client.ResolvePayload(ctx, missing.Reference()); !IsNotFound(err) {
		t.Errorf("a reference to no blob: %v, want NOT_FOUND", err)
	}
}

// The shortcut that skips encoding small values never lets one over the
// limit through.
func TestSurelyWithinNeverUnderestimates(t *testing.T) {
	values := []string{
		`null`, `true`, `false`, `0`, `-1.2345678901234567e-100`, `""`, `"\u0000\u0001\u001f"`,
		`{}`, `[]`, `{"":""}`, `{"\u0000":"\u0000"}`, `[null,null,null,[],{}]`, `{"a":{"b":{"c":[1,2,3]}}}`,
		`"héllo wörld ✓"`, `[1e300,-1e-300,123456789.123]`,
	}
	for _, raw := range values {
		v := mustValue(t, raw)
		b, err := compactJSON(v)
		if err != nil {
			t.Fatal(err)
		}
		if n := int64(len(b)); surelyWithin(v, n-1) {
			t.Errorf("%s: surelyWithin(%d) holds for %d bytes of JSON", raw, n-1, n)
		}
	}
	if !surelyWithin(mustValue(t, `{"x":1}`), 128) {
		t.Error("a tiny value is not surely within 128 bytes")
	}
}

func inputOf(t *testing.T, req *pb.StartRunRequest) string {
	t.Helper()
	return string(rawJSON(req.GetInput()))
}

// StartRun and SendEvent send a value inline up to the threshold and its
// reference beyond it; the threshold is asked once; 0 never offloads.
func TestStartRunAndSendEventOffloadBeyondTheThreshold(t *testing.T) {
	f, client := startFake(t)
	ctx := context.Background()
	f.mu.Lock()
	f.offload = 1000
	f.mu.Unlock()
	// {"doc":"…"} is 10 bytes besides the string.
	at := map[string]string{"doc": strings.Repeat("a", 990)}
	over := map[string]string{"doc": strings.Repeat("a", 991)}
	if _, err := client.StartRun(ctx, "wf", map[string]int{"n": 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.StartRun(ctx, "wf", at); err != nil {
		t.Fatal(err)
	}
	if _, err := client.StartRun(ctx, "wf", over); err != nil {
		t.Fatal(err)
	}
	if _, err := client.SendEvent(ctx, Event{Name: "e", RunID: "r1", Payload: over}); err != nil {
		t.Fatal(err)
	}
	f.runs.mu.Lock()
	starts, events := f.runs.starts, f.runs.events
	f.runs.mu.Unlock()
	if len(starts) != 3 || len(events) != 1 {
		t.Fatalf("%d starts, %d events", len(starts), len(events))
	}
	if inputOf(t, starts[0]) != `{"n":1}` || len(inputOf(t, starts[1])) != 1000 {
		t.Errorf("the inputs within the threshold were not sent inline: %.80s, %.80s", inputOf(t, starts[0]), inputOf(t, starts[1]))
	}
	ref, ok := ParseBlobRef(rawJSON(starts[2].GetInput()))
	overJSON := `{"doc":"` + strings.Repeat("a", 991) + `"}`
	if !ok || ref.Size != 1001 || !bytes.Equal(f.blobs.get(ref.SHA256), []byte(overJSON)) {
		t.Errorf("the input over the threshold: sent %.200s", inputOf(t, starts[2]))
	}
	if eref, ok := ParseBlobRef(rawJSON(events[0].GetPayload())); !ok || eref != ref {
		t.Errorf("the event payload over the threshold: sent %.200s", rawJSON(events[0].GetPayload()))
	}
	f.mu.Lock()
	infos := f.infos
	f.mu.Unlock()
	if infos != 1 {
		t.Errorf("GetServerInfo asked %d times, want once", infos)
	}

	// A server that offloads nothing.
	f.mu.Lock()
	f.offload = 0
	f.mu.Unlock()
	other, err := Dial(ctx, client.Address(), WithToken(""))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.StartRun(ctx, "wf", over); err != nil {
		t.Fatal(err)
	}
	f.runs.mu.Lock()
	last := f.runs.starts[len(f.runs.starts)-1]
	f.runs.mu.Unlock()
	if inputOf(t, last) != overJSON {
		t.Errorf("threshold 0 offloaded: %.200s", inputOf(t, last))
	}
	if uploads, _ := f.blobs.recorded(); len(uploads) != 2 {
		t.Errorf("%d uploads, want 2", len(uploads))
	}
}

// WaitForResult and RunWorkflow resolve the output they return; GetRun and
// WaitForRun show the reference as stored.
func TestTheWaitResolvesTheOutputAndGetRunDoesNot(t *testing.T) {
	f, client := startFake(t)
	ctx := context.Background()
	big := `{"doc":"` + strings.Repeat("z", 5000) + `"}`
	ref := f.blobs.put([]byte(big))
	f.runs.mu.Lock()
	f.runs.run = &pb.Run{RunId: "r1", Status: pb.RunStatus_RUN_STATUS_COMPLETED, Output: mustValue(t, `{"a":`+string(ref.Reference())+`,"b":2}`)}
	f.runs.mu.Unlock()
	var out struct {
		A struct{ Doc string } `json:"a"`
		B int                  `json:"b"`
	}
	if err := client.WaitForResult(ctx, "r1", &out); err != nil {
		t.Fatal(err)
	}
	if len(out.A.Doc) != 5000 || out.B != 2 {
		t.Errorf("WaitForResult decoded %d characters and b=%d", len(out.A.Doc), out.B)
	}
	run, err := client.RunWorkflow(ctx, "wf", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !sameJSON(t, run.Output, []byte(`{"a":`+big+`,"b":2}`)) {
		t.Errorf("RunWorkflow's run output %.200s", run.Output)
	}
	stored, err := client.GetRun(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	var shown struct{ A json.RawMessage }
	_ = json.Unmarshal(stored.Output, &shown)
	if got, ok := ParseBlobRef(shown.A); !ok || got != ref {
		t.Errorf("GetRun shows %.200s, want the reference", stored.Output)
	}
	waited, err := client.WaitForRun(ctx, "r1")
	if err != nil || !bytes.Equal(waited.Output, stored.Output) {
		t.Errorf("WaitForRun shows %.200s, %v", waited.Output, err)
	}
}

// The worker hands its handler the input with every reference resolved,
// reports an output over the threshold as the reference of its upload, a
// small one inline, and fails an attempt whose input blob is gone.
func TestWorkerResolvesTheInputAndOffloadsTheOutput(t *testing.T) {
	f, client := startFake(t)
	f.mu.Lock()
	f.offload = 2000
	f.mu.Unlock()
	doc := strings.Repeat("q", 3000)
	ref := f.blobs.put([]byte(`{"doc":"` + doc + `","n":7}`))
	seen := make(chan string, 3)
	w := NewWorker(client, WorkerOptions{Slots: 1, PollWait: 200 * time.Millisecond, Backoff: fastBackoff})
	w.Handle("q", "grow", func(ctx context.Context, task *Task) (any, error) {
		seen <- string(task.Input)
		var in struct {
			Wrapped struct {
				Doc string `json:"doc"`
				N   int    `json:"n"`
			} `json:"wrapped"`
		}
		if err := task.Decode(&in); err != nil {
			return nil, err
		}
		if in.Wrapped.N == 0 {
			return map[string]int{"small": 1}, nil
		}
		return map[string]any{"doc": in.Wrapped.Doc + "!", "n": in.Wrapped.N}, nil
	})
	runWorker(t, w)
	var input map[string]any
	_ = json.Unmarshal([]byte(`{"wrapped":`+string(ref.Reference())+`}`), &input)
	f.add(fakeTask("big", "q", "grow", 3*time.Second, input))
	eventually(t, 10*time.Second, "big completed", func() bool { return w.Stats().Completed == 1 })
	if got := <-seen; !sameJSON(t, []byte(got), []byte(`{"wrapped":{"doc":"`+doc+`","n":7}}`)) {
		t.Errorf("the handler saw %.200s", got)
	}
	_, _, completes, _ := f.snapshot()
	outRef, ok := ParseBlobRef(rawJSON(completes[0].GetOutput()))
	wantOut := `{"doc":"` + doc + `!","n":7}`
	if !ok || !bytes.Equal(f.blobs.get(outRef.SHA256), []byte(wantOut)) || outRef.Size != int64(len(wantOut)) {
		t.Errorf("the large output was reported as %.200s", rawJSON(completes[0].GetOutput()))
	}

	f.add(fakeTask("small", "q", "grow", 3*time.Second, map[string]any{"wrapped": map[string]any{}}))
	eventually(t, 10*time.Second, "small completed", func() bool { return w.Stats().Completed == 2 })
	<-seen
	_, _, completes, _ = f.snapshot()
	if got := string(rawJSON(completes[1].GetOutput())); got != `{"small":1}` {
		t.Errorf("the small output was reported as %s", got)
	}

	gone := BlobRef{SHA256: strings.Repeat("b", 64), Size: 10, Head: "{}"}
	var goneInput map[string]any
	_ = json.Unmarshal(gone.Reference(), &goneInput)
	f.add(fakeTask("gone", "q", "grow", 3*time.Second, map[string]any{"wrapped": goneInput}))
	eventually(t, 10*time.Second, "gone failed", func() bool { return w.Stats().Failed == 1 })
	_, _, _, fails := f.snapshot()
	if r := fails[0]; r.GetErrorCode() != "INPUT_UNAVAILABLE" || r.GetRetryable() || !strings.Contains(r.GetMessage(), "NOT_FOUND") {
		t.Errorf("an input whose blob is gone: %v", r)
	}
	if len(seen) != 0 {
		t.Error("the handler ran with an input whose blob is gone")
	}
}

// An upload the server refuses as too large fails the attempt with
// OUTPUT_TOO_LARGE, non-retryably.
func TestWorkerFailsAnOutputTheBlobStoreRefuses(t *testing.T) {
	f, client := startFake(t)
	f.mu.Lock()
	f.offload = 500
	f.mu.Unlock()
	f.blobs.mu.Lock()
	f.blobs.tooLarge = 1000
	f.blobs.mu.Unlock()
	w := NewWorker(client, WorkerOptions{Slots: 1, PollWait: 200 * time.Millisecond, Backoff: fastBackoff})
	w.Handle("q", "huge", func(ctx context.Context, task *Task) (any, error) { return strings.Repeat("h", 5000), nil })
	runWorker(t, w)
	f.add(fakeTask("huge", "q", "huge", 3*time.Second, nil))
	eventually(t, 10*time.Second, "huge failed", func() bool { return w.Stats().Failed == 1 })
	_, _, completes, fails := f.snapshot()
	if len(completes) != 0 || fails[0].GetErrorCode() != "OUTPUT_TOO_LARGE" || fails[0].GetRetryable() {
		t.Errorf("completes %v, fail %v", completes, fails[0])
	}
}

// logBuffer collects a Client's logs, safely for concurrent writers.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// loggedClient is a Client of the fake server whose logs (all levels) go
// to the returned buffer.
func loggedClient(t *testing.T, client *Client) (*Client, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	c, err := Dial(context.Background(), client.Address(), WithToken(""),
		WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, logs
}

// noURLInLogs fails the test if a URL's signature reached the logs.
func noURLInLogs(t *testing.T, logs *logBuffer) {
	t.Helper()
	if text := logs.String(); strings.Contains(text, "s3cr3t") || strings.Contains(text, "/uploads/") || strings.Contains(text, "/blobs/") {
		t.Errorf("a URL was logged:\n%s", text)
	}
}

// C24: when the server says blob_urls, an upload is StartBlobUpload, one
// PUT of the bytes (Content-Length set) and FinishBlobUpload, a download
// GetBlobUrl and one GET; no stream is opened, NOT_FOUND stays NOT_FOUND,
// and what C23 moves (here StartRun's input) goes the same way.
func TestBlobsMoveThroughPresignedURLsWhenTheServerGivesThem(t *testing.T) {
	f, base := startFake(t)
	serveURLs(t, f)
	f.mu.Lock()
	f.offload = 1000
	f.mu.Unlock()
	client, logs := loggedClient(t, base)
	ctx := context.Background()
	data := []byte(`"` + strings.Repeat("u", 2*BlobChunkSize+BlobChunkSize/2) + `"`)
	ref, err := client.UploadBlob(ctx, data)
	if err != nil {
		t.Fatal(err)
	}
	if ref.SHA256 != digest(data) || ref.Size != int64(len(data)) || !strings.HasPrefix(ref.Head, `"uuu`) {
		t.Errorf("ref %+v", ref)
	}
	if !bytes.Equal(f.blobs.get(ref.SHA256), data) {
		t.Error("the stored blob differs from the bytes uploaded")
	}
	calls, puts, gets := f.blobs.urlRecords()
	if want := []string{"StartBlobUpload", "FinishBlobUpload"}; !reflect.DeepEqual(calls, want) {
		t.Errorf("URL calls %v, want %v", calls, want)
	}
	if len(puts) != 1 || puts[0].path != "/uploads/upload-1" || puts[0].contentLength != int64(len(data)) || len(gets) != 0 {
		t.Errorf("PUTs %+v and GETs %+v, want one PUT of %d bytes (Content-Length) to /uploads/upload-1", puts, gets, len(data))
	}

	got, err := client.DownloadBlob(ctx, ref.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Errorf("downloaded %d bytes, want %d", len(got), len(data))
	}
	if _, err := client.DownloadBlob(ctx, strings.Repeat("0", 64)); !IsNotFound(err) {
		t.Errorf("unknown blob: %v, want NOT_FOUND", err)
	}
	calls, _, gets = f.blobs.urlRecords()
	if want := []string{"StartBlobUpload", "FinishBlobUpload", "GetBlobUrl", "GetBlobUrl"}; !reflect.DeepEqual(calls, want) {
		t.Errorf("URL calls %v, want %v", calls, want)
	}
	if len(gets) != 1 || gets[0].path != "/blobs/"+ref.SHA256 {
		t.Errorf("GETs %+v, want one of /blobs/%s", gets, ref.SHA256)
	}

	// StartRun's large input goes up the same way.
	if _, err := client.StartRun(ctx, "wf", map[string]string{"doc": strings.Repeat("i", 2000)}); err != nil {
		t.Fatal(err)
	}
	f.runs.mu.Lock()
	input := rawJSON(f.runs.starts[0].GetInput())
	f.runs.mu.Unlock()
	if inRef, ok := ParseBlobRef(input); !ok || f.blobs.get(inRef.SHA256) == nil {
		t.Errorf("StartRun sent %.200s, want a reference to a stored blob", input)
	}
	if _, puts, _ = f.blobs.urlRecords(); len(puts) != 2 {
		t.Errorf("%d PUTs, want 2", len(puts))
	}
	if uploads, downloads := f.blobs.recorded(); len(uploads) != 0 || len(downloads) != 0 {
		t.Errorf("streams were opened: %d uploads, %d downloads", len(uploads), len(downloads))
	}
	noURLInLogs(t, logs)
}

// C24: a URL call answered FAILED_PRECONDITION (the server stopped giving
// URLs) sends that call and every later one of the Client through the
// streams, without asking for a URL again; another Client still asks.
func TestAURLCallRefusedSendsTheClientToTheStreams(t *testing.T) {
	f, base := startFake(t)
	serveURLs(t, f)
	f.blobs.mu.Lock()
	f.blobs.refuseURLs = true
	f.blobs.mu.Unlock()
	client, logs := loggedClient(t, base)
	ctx := context.Background()
	data := []byte(`{"doc":"` + strings.Repeat("r", 5000) + `"}`)
	ref, err := client.UploadBlob(ctx, data)
	if err != nil {
		t.Fatal(err)
	}
	if ref.SHA256 != digest(data) || !bytes.Equal(f.blobs.get(ref.SHA256), data) {
		t.Errorf("ref %+v", ref)
	}
	// The server would give URLs again: this Client no longer asks.
	f.blobs.mu.Lock()
	f.blobs.refuseURLs = false
	f.blobs.mu.Unlock()
	if got, err := client.DownloadBlob(ctx, ref.SHA256); err != nil || !bytes.Equal(got, data) {
		t.Errorf("download: %d bytes, %v", len(got), err)
	}
	if _, err := client.UploadBlob(ctx, data); err != nil {
		t.Fatal(err)
	}
	if _, err := client.DownloadBlob(ctx, strings.Repeat("0", 64)); !IsNotFound(err) {
		t.Errorf("unknown blob: %v, want NOT_FOUND", err)
	}
	calls, puts, gets := f.blobs.urlRecords()
	if want := []string{"StartBlobUpload"}; !reflect.DeepEqual(calls, want) {
		t.Errorf("URL calls %v, want only the refused %v", calls, want)
	}
	if len(puts) != 0 || len(gets) != 0 {
		t.Errorf("HTTP requests were made: %d PUTs, %d GETs", len(puts), len(gets))
	}
	uploads, downloads := f.blobs.recorded()
	if len(uploads) != 2 || len(downloads) != 2 {
		t.Errorf("streams: %d uploads, %d downloads, want 2 and 2", len(uploads), len(downloads))
	}

	// A refused GetBlobUrl does the same; a Client of its own still asks.
	f.blobs.mu.Lock()
	f.blobs.refuseURLs = true
	f.blobs.mu.Unlock()
	other, _ := loggedClient(t, base)
	if got, err := other.DownloadBlob(ctx, ref.SHA256); err != nil || !bytes.Equal(got, data) {
		t.Errorf("the other client's download: %d bytes, %v", len(got), err)
	}
	f.blobs.mu.Lock()
	f.blobs.refuseURLs = false
	f.blobs.mu.Unlock()
	if _, err := other.UploadBlob(ctx, data); err != nil {
		t.Fatal(err)
	}
	calls, _, _ = f.blobs.urlRecords()
	if want := []string{"StartBlobUpload", "GetBlobUrl"}; !reflect.DeepEqual(calls, want) {
		t.Errorf("URL calls %v, want %v", calls, want)
	}
	if uploads, downloads := f.blobs.recorded(); len(uploads) != 3 || len(downloads) != 3 {
		t.Errorf("streams: %d uploads, %d downloads, want 3 and 3", len(uploads), len(downloads))
	}
	noURLInLogs(t, logs)
}

// C24: an HTTP request to a URL that fails (nothing listens there; the
// store answers 403) sends that one call through the stream; the next call
// asks for a URL again. No URL reaches the logs.
func TestAFailedURLRequestFallsBackToTheStreamForThatCall(t *testing.T) {
	f, base := startFake(t)
	serveURLs(t, f)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedURL := "http://" + closed.Addr().String()
	_ = closed.Close()
	f.blobs.mu.Lock()
	f.blobs.urlBase = closedURL
	f.blobs.mu.Unlock()
	client, logs := loggedClient(t, base)
	ctx := context.Background()
	data := []byte(`{"doc":"` + strings.Repeat("c", 5000) + `"}`)
	ref, err := client.UploadBlob(ctx, data)
	if err != nil {
		t.Fatal(err)
	}
	if ref.SHA256 != digest(data) || !bytes.Equal(f.blobs.get(ref.SHA256), data) {
		t.Errorf("ref %+v", ref)
	}
	if got, err := client.DownloadBlob(ctx, ref.SHA256); err != nil || !bytes.Equal(got, data) {
		t.Errorf("download: %d bytes, %v", len(got), err)
	}
	calls, _, _ := f.blobs.urlRecords()
	if want := []string{"StartBlobUpload", "GetBlobUrl"}; !reflect.DeepEqual(calls, want) {
		t.Errorf("URL calls %v, want %v (no FinishBlobUpload after a failed PUT)", calls, want)
	}
	if uploads, downloads := f.blobs.recorded(); len(uploads) != 1 || len(downloads) != 1 {
		t.Errorf("streams: %d uploads, %d downloads, want 1 and 1", len(uploads), len(downloads))
	}

	// The store answers, with 403: the next calls ask for URLs again and
	// fall back once more.
	serveURLs(t, f)
	f.blobs.mu.Lock()
	f.blobs.failHTTP = true
	f.blobs.mu.Unlock()
	if _, err := client.UploadBlob(ctx, data); err != nil {
		t.Fatal(err)
	}
	if got, err := client.DownloadBlob(ctx, ref.SHA256); err != nil || !bytes.Equal(got, data) {
		t.Errorf("download: %d bytes, %v", len(got), err)
	}
	calls, puts, gets := f.blobs.urlRecords()
	if want := []string{"StartBlobUpload", "GetBlobUrl", "StartBlobUpload", "GetBlobUrl"}; !reflect.DeepEqual(calls, want) {
		t.Errorf("URL calls %v, want %v", calls, want)
	}
	if len(puts) != 1 || len(gets) != 1 {
		t.Errorf("%d PUTs and %d GETs reached the store, want 1 and 1", len(puts), len(gets))
	}
	if uploads, downloads := f.blobs.recorded(); len(uploads) != 2 || len(downloads) != 2 {
		t.Errorf("streams: %d uploads, %d downloads, want 2 and 2", len(uploads), len(downloads))
	}
	if text := logs.String(); strings.Count(text, "the server's stream") != 4 {
		t.Errorf("want 4 warnings of a fallback to the stream, logged:\n%s", text)
	}
	noURLInLogs(t, logs)
}
