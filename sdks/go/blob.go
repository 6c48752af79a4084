package composer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	pb "github.com/composer-dev/composer/sdks/go/gen/composer/v1"
)

// Large payloads (docs/payloads.md). A value whose compact JSON is longer
// than the server's offload threshold (ServerInfo.PayloadOffloadBytes) is
// kept in the namespace's blob store and carried as a reference, the JSON
// object {"$blob": {"sha256": ..., "size": ..., "head": ...}}. The Client
// uploads a large run input or event payload and sends its reference;
// WaitForResult and RunWorkflow resolve the output they return; a Worker
// resolves every reference in a task's input before its handler runs and
// uploads a large output. GetRun, WatchRun and the history show references
// as stored: ResolvePayload (or DownloadBlob) reads what they name.

// BlobChunkSize is the size of the chunks UploadBlob sends (the most
// BlobService takes in one message): 1 MiB.
const BlobChunkSize = 1 << 20

// blobKey is the only key of a reference object.
const blobKey = "$blob"

// minOffload: a value whose compact JSON is at most this long is never
// offloaded (a reference is about as long), so sending it needs no
// ServerInfo.
const minOffload = 128

// maxBlobNesting bounds how deep references found inside downloaded blobs
// are followed.
const maxBlobNesting = 16

// BlobRef names a blob of the namespace, as the "$blob" object of a
// reference holds it.
type BlobRef struct {
	// SHA256 is the SHA-256 of the blob's bytes, 64 lowercase hex digits.
	SHA256 string `json:"sha256"`
	// Size is the blob's length in bytes.
	Size int64 `json:"size"`
	// Head is its first bytes (at most 256, cut at a character boundary),
	// for a preview.
	Head string `json:"head"`
}

// Reference is the reference object that stands for the blob in a value:
// {"$blob": {"sha256": ..., "size": ..., "head": ...}}.
func (r BlobRef) Reference() json.RawMessage {
	return rawJSON(r.value())
}

func (r BlobRef) value() *structpb.Value {
	return structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
		blobKey: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"sha256": structpb.NewStringValue(r.SHA256),
			"size":   structpb.NewNumberValue(float64(r.Size)),
			"head":   structpb.NewStringValue(r.Head),
		}}),
	}})
}

// ParseBlobRef reports whether value (JSON) is a reference, an object whose
// only key is "$blob" naming a well-formed sha256, and returns what it names.
func ParseBlobRef(value json.RawMessage) (BlobRef, bool) {
	v, err := toValue(value)
	if err != nil || !isReference(v) {
		return BlobRef{}, false
	}
	ref, err := refFrom(v)
	return ref, err == nil
}

// isReference reports whether v is an object whose only key is "$blob".
func isReference(v *structpb.Value) bool {
	fields := v.GetStructValue().GetFields()
	if len(fields) != 1 {
		return false
	}
	_, ok := fields[blobKey]
	return ok
}

// refFrom reads the BlobRef of a reference (isReference(v) holds); an error
// says what is malformed.
func refFrom(v *structpb.Value) (BlobRef, error) {
	inner := v.GetStructValue().GetFields()[blobKey].GetStructValue()
	if inner == nil {
		return BlobRef{}, errors.New(`"$blob" must be an object {"sha256", "size", "head"}`)
	}
	f := inner.GetFields()
	ref := BlobRef{SHA256: f["sha256"].GetStringValue(), Size: int64(f["size"].GetNumberValue()), Head: f["head"].GetStringValue()}
	if !validSHA256(ref.SHA256) {
		return BlobRef{}, errors.New(`"$blob".sha256 must be 64 lowercase hex digits`)
	}
	return ref, nil
}

func validSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// UploadBlob stores data, the JSON text of one value, as a blob of the
// namespace and returns its reference's BlobRef: put BlobRef.Reference() in
// a value in its stead. The bytes go in chunks of BlobChunkSize, so data may
// be larger than a gRPC message; the same bytes uploaded twice are one
// blob. INVALID_ARGUMENT naming `data` when data is not JSON;
// RESOURCE_EXHAUSTED beyond the server's max_payload_bytes. The Client's
// default timeout bounds each wait for the server, not the whole upload.
// When the server gives presigned URLs (ServerInfo.BlobURLs), the bytes go
// straight to the blob store instead, with one HTTP PUT to a URL the
// server signs (the stream when the store cannot be reached from here).
func (c *Client) UploadBlob(ctx context.Context, data []byte) (BlobRef, error) {
	if c.blobURLs(ctx) {
		if ref, done, err := c.uploadThroughURL(ctx, data); done {
			return ref, err
		}
	}
	return c.uploadStream(ctx, data)
}

// uploadStream is UploadBlob through the server's UploadBlob stream.
func (c *Client) uploadStream(ctx context.Context, data []byte) (BlobRef, error) {
	ctx, progress, cancel := c.streamContext(ctx)
	defer cancel()
	stream, err := c.blobs.UploadBlob(ctx, waitForReady)
	if err != nil {
		return BlobRef{}, streamError(ctx, err)
	}
	for _, chunk := range chunks(data, BlobChunkSize) {
		if err := stream.Send(&pb.UploadBlobRequest{Data: chunk}); err != nil {
			if err == io.EOF {
				break // the server ended the stream: CloseAndRecv says why
			}
			return BlobRef{}, streamError(ctx, err)
		}
		progress()
	}
	r, err := stream.CloseAndRecv()
	if err != nil {
		return BlobRef{}, streamError(ctx, err)
	}
	b := r.GetBlob()
	return BlobRef{SHA256: b.GetSha256(), Size: b.GetSize(), Head: b.GetHead()}, nil
}

// chunks cuts data into pieces of at most size bytes (none for no data).
func chunks(data []byte, size int) [][]byte {
	var out [][]byte
	for len(data) > 0 {
		n := min(size, len(data))
		out = append(out, data[:n])
		data = data[n:]
	}
	return out
}

// DownloadBlob returns the bytes of the namespace's blob with this SHA-256
// (the JSON text of a value). A stream broken by the network or a server
// restart is opened again from where it stopped (with back-off); the bytes
// are checked against sha256 (DATA_LOSS when they differ). NOT_FOUND when
// the namespace has no such blob (another namespace's blob is never
// found); INVALID_ARGUMENT naming `sha256` when it is not 64 lowercase hex
// digits. The Client's default timeout bounds each wait for the server,
// not the whole download. When the server gives presigned URLs
// (ServerInfo.BlobURLs), the bytes come straight from the blob store
// instead, with one HTTP GET of a URL the server signs (the stream when the
// store cannot be reached from here).
func (c *Client) DownloadBlob(ctx context.Context, sha string) ([]byte, error) {
	if !validSHA256(sha) {
		return nil, invalidArgument("sha256", "must be 64 lowercase hex digits")
	}
	if c.blobURLs(ctx) {
		if data, done, err := c.downloadThroughURL(ctx, sha); done {
			return data, err
		}
	}
	var data []byte
	size := int64(-1)
	failures := 0
	for {
		err := c.downloadFrom(ctx, sha, &data, &size)
		if err == nil {
			break
		}
		if !IsRetryable(err) || ctx.Err() != nil || failures >= 5 {
			return nil, err
		}
		failures++
		c.logger.Debug("composer: blob download broken; resuming", "sha256", sha, "offset", len(data), "error", err)
		if !sleepCtx(ctx, DefaultBackoff.Delay(failures)) {
			return nil, err
		}
	}
	if size < 0 { // no chunk came: the checksum below judges
		size = int64(len(data))
	}
	if int64(len(data)) != size {
		return nil, &Error{Code: codes.DataLoss, Message: fmt.Sprintf("blob %s: got %d bytes of %d", sha, len(data), size)}
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != sha {
		return nil, &Error{Code: codes.DataLoss, Message: fmt.Sprintf("blob %s: the bytes received have another SHA-256", sha)}
	}
	return data, nil
}

// downloadFrom streams the blob from len(*data) on, appending to *data; the
// first chunk of the first stream sets *size (the whole size).
func (c *Client) downloadFrom(ctx context.Context, sha string, data *[]byte, size *int64) error {
	ctx, progress, cancel := c.streamContext(ctx)
	defer cancel()
	stream, err := c.blobs.DownloadBlob(ctx, &pb.DownloadBlobRequest{Sha256: sha, Offset: int64(len(*data))}, waitForReady)
	if err != nil {
		return streamError(ctx, err)
	}
	first := true
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return streamError(ctx, err)
		}
		progress()
		if first && *size < 0 {
			*size = msg.GetSize()
			// Trust the announced size for the allocation only up to 1 GiB.
			*data = make([]byte, 0, min(max(*size, 0), 1<<30))
		}
		first = false
		*data = append(*data, msg.GetData()...)
	}
}

// streamContext adds the token and, when ctx has no deadline, a watchdog
// that ends the stream once the server has been silent (no chunk sent or
// received) for the Client's timeout. progress rearms the watchdog.
func (c *Client) streamContext(ctx context.Context) (_ context.Context, progress func(), cancel func()) {
	return c.watchdog(c.OutgoingContext(ctx))
}

// watchdog is streamContext without the token (for the HTTP requests to
// presigned URLs).
func (c *Client) watchdog(ctx context.Context) (_ context.Context, progress func(), cancel func()) {
	if _, ok := ctx.Deadline(); ok || c.timeout <= 0 {
		ctx, cancel := context.WithCancel(ctx)
		return ctx, func() {}, cancel
	}
	ctx, stop := context.WithCancelCause(ctx)
	timeout := c.timeout
	timer := time.AfterFunc(timeout, func() { stop(errStreamSilent) })
	return ctx, func() { timer.Reset(timeout) }, func() { timer.Stop(); stop(nil) }
}

// errStreamSilent is the cause of a blob stream ended by its watchdog.
var errStreamSilent = errors.New("the server sent or took nothing within the client's timeout")

// streamError converts a stream's error; a stream ended by the watchdog is
// DEADLINE_EXCEEDED.
func streamError(ctx context.Context, err error) error {
	if errors.Is(context.Cause(ctx), errStreamSilent) {
		return &Error{Code: codes.DeadlineExceeded, Message: errStreamSilent.Error()}
	}
	return convertError(err)
}

// ResolvePayload returns a copy of value (JSON, e.g. a Run's Input or a
// NodeState's Output as GetRun shows them) with every reference, at any
// depth, replaced by the value it names; each distinct blob is downloaded
// once (and references inside a downloaded value are resolved too). A value
// without references comes back unchanged. Errors are DownloadBlob's, or
// INVALID_ARGUMENT naming the path of a malformed reference.
func (c *Client) ResolvePayload(ctx context.Context, value json.RawMessage) (json.RawMessage, error) {
	if len(bytes.TrimSpace(value)) == 0 {
		return value, nil
	}
	v, err := toValue(value)
	if err != nil {
		return nil, invalidArgument("value", err.Error())
	}
	resolved, err := newResolver(c).resolve(ctx, v, "value")
	if err != nil {
		return nil, err
	}
	if resolved == v {
		return value, nil
	}
	return rawJSON(resolved), nil
}

// resolver replaces references with the values they name, downloading each
// blob once.
type resolver struct {
	c     *Client
	blobs map[string]*structpb.Value
	depth int // how many downloaded blobs the current walk is inside
}

func newResolver(c *Client) *resolver {
	return &resolver{c: c, blobs: map[string]*structpb.Value{}}
}

// resolve returns v with every reference replaced, or v itself (the same
// pointer) when it holds none. v is never modified: changed objects and
// lists are new, unchanged subtrees are shared. path names v in errors.
func (r *resolver) resolve(ctx context.Context, v *structpb.Value, path string) (*structpb.Value, error) {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StructValue:
		if isReference(v) {
			return r.fetch(ctx, v, path)
		}
		var fields map[string]*structpb.Value
		for key, item := range k.StructValue.GetFields() {
			got, err := r.resolve(ctx, item, path+"."+key)
			if err != nil {
				return nil, err
			}
			if got != item && fields == nil {
				fields = make(map[string]*structpb.Value, len(k.StructValue.GetFields()))
				for key2, item2 := range k.StructValue.GetFields() {
					fields[key2] = item2
				}
			}
			if fields != nil {
				fields[key] = got
			}
		}
		if fields == nil {
			return v, nil
		}
		return structpb.NewStructValue(&structpb.Struct{Fields: fields}), nil
	case *structpb.Value_ListValue:
		items := k.ListValue.GetValues()
		var values []*structpb.Value
		for i, item := range items {
			got, err := r.resolve(ctx, item, path+"["+strconv.Itoa(i)+"]")
			if err != nil {
				return nil, err
			}
			if got != item && values == nil {
				values = append([]*structpb.Value(nil), items...)
			}
			if values != nil {
				values[i] = got
			}
		}
		if values == nil {
			return v, nil
		}
		return structpb.NewListValue(&structpb.ListValue{Values: values}), nil
	}
	return v, nil
}

// fetch returns the value a reference names, downloaded and decoded once
// per blob, its own references resolved.
func (r *resolver) fetch(ctx context.Context, v *structpb.Value, path string) (*structpb.Value, error) {
	ref, err := refFrom(v)
	if err != nil {
		return nil, invalidArgument(path, err.Error())
	}
	if got, ok := r.blobs[ref.SHA256]; ok {
		return got, nil
	}
	if r.depth >= maxBlobNesting {
		return nil, invalidArgument(path, fmt.Sprintf("references nested in blobs more than %d deep", maxBlobNesting))
	}
	data, err := r.c.DownloadBlob(ctx, ref.SHA256)
	if err != nil {
		return nil, err
	}
	decoded := &structpb.Value{}
	if err := protojson.Unmarshal(data, decoded); err != nil {
		return nil, &Error{Code: codes.DataLoss, Message: fmt.Sprintf("%s: blob %s is not JSON: %v", path, ref.SHA256, err)}
	}
	r.depth++
	resolved, err := r.resolve(ctx, decoded, path)
	r.depth--
	if err != nil {
		return nil, err
	}
	r.blobs[ref.SHA256] = resolved
	return resolved, nil
}

// compactJSON is v's compact JSON text (object keys sorted).
func compactJSON(v *structpb.Value) ([]byte, error) {
	if b, ok := appendValueJSON(nil, v, 0); ok {
		return b, nil
	}
	b, err := protojson.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// surelyWithin reports, without encoding v, that v's compact JSON is at
// most limit bytes. Each byte of v's protobuf encoding stands for at most
// six of JSON (a control character's \u00XX escape; a number's 9 bytes
// for at most 24 characters; an object member's key and value for their
// JSON plus `"":,`), plus 2 for a top-level empty string.
func surelyWithin(v *structpb.Value, limit int64) bool {
	return 6*int64(proto.Size(v))+2 <= limit
}

// offloadThreshold is the server's payload_offload_bytes (0: never),
// asked once per Client (ServerInfo refreshes it). A server without
// ServerService (UNIMPLEMENTED) offloads nothing.
func (c *Client) offloadThreshold(ctx context.Context) (int64, error) {
	info, err := c.cachedServerInfo(ctx)
	if err != nil {
		return 0, err
	}
	return info.PayloadOffloadBytes, nil
}

// serverInfoCache is the Client's last ServerInfo, for the offload
// threshold and BlobURLs.
type serverInfoCache struct {
	infoMu sync.Mutex
	info   *ServerInfo
}

func (s *serverInfoCache) remember(info *ServerInfo) {
	kept := *info
	s.infoMu.Lock()
	s.info = &kept
	s.infoMu.Unlock()
}

// offload returns v, or the reference of a blob holding it when its compact
// JSON is longer than threshold (> 0); what names v in errors.
func (c *Client) offload(ctx context.Context, v *structpb.Value, threshold int64, what string) (*structpb.Value, error) {
	if threshold <= 0 || surelyWithin(v, max(threshold, minOffload)) {
		return v, nil
	}
	data, err := compactJSON(v)
	if err != nil {
		return nil, fmt.Errorf("composer: encode %s: %w", what, err)
	}
	if int64(len(data)) <= max(threshold, minOffload) {
		return v, nil
	}
	ref, err := c.UploadBlob(ctx, data)
	if err != nil {
		return nil, fmt.Errorf("composer: upload %s (%d bytes): %w", what, len(data), err)
	}
	return ref.value(), nil
}

// offloadArgument is offload for a value the caller gives (a run's input,
// an event's payload), with the threshold asked of the server once.
func (c *Client) offloadArgument(ctx context.Context, v *structpb.Value, what string) (*structpb.Value, error) {
	if surelyWithin(v, minOffload) {
		return v, nil
	}
	threshold, err := c.offloadThreshold(ctx)
	if err != nil {
		return nil, err
	}
	return c.offload(ctx, v, threshold, what)
}

// resolveOutput returns run with its Output's references resolved.
func (c *Client) resolveOutput(ctx context.Context, run *Run) (*Run, error) {
	if run.Status != RunCompleted || !bytes.Contains(run.Output, []byte(blobKey)) {
		return run, nil
	}
	output, err := c.ResolvePayload(ctx, run.Output)
	if err != nil {
		return nil, fmt.Errorf("composer: resolve the output of run %s: %w", run.ID, err)
	}
	resolved := *run
	resolved.Output = output
	return &resolved, nil
}

// resolveInput replaces every reference in the attempt's task input with
// the value it names, before the handler runs: Task.Input never holds a
// reference. A blob that cannot be read fails the attempt with code
// INPUT_UNAVAILABLE (as in the other SDKs), retryable when the server could
// not be reached (UNAVAILABLE, DEADLINE_EXCEEDED) or was busy (a quota, the
// CPU pool), final otherwise (the
// blob is gone, the reference malformed).
func (w *Worker) resolveInput(a *attempt) error {
	input := a.raw.GetInput()
	if input == nil {
		return nil
	}
	resolved, err := newResolver(w.client).resolve(a.ctx, input, "input")
	if err != nil {
		if a.ctx.Err() != nil {
			return err // the context's cause says why (cancelled, lease lost, timeout)
		}
		a.task.Logger.Warn("composer could not download the input's blobs", "error", err)
		return &TaskError{Code: "INPUT_UNAVAILABLE", Message: "could not read the task's input: " + err.Error(), Retryable: IsRetryable(err) || isBusy(err), Err: err}
	}
	if resolved != input {
		a.task.Input = rawJSON(resolved)
	}
	return nil
}

// outputValue encodes a handler's output (INVALID_OUTPUT when it is not
// JSON) and, when its compact JSON is longer than the server's offload
// threshold, uploads it and returns its reference. An upload refused as too
// large fails the attempt with OUTPUT_TOO_LARGE; one that fails otherwise
// with OUTPUT_UPLOAD_FAILED, retryable when the server could not be reached
// or stayed busy (after uploadOutput's own retries).
func (w *Worker) outputValue(a *attempt, out any) (*structpb.Value, error) {
	value, err := toValue(out)
	if err != nil {
		return nil, &TaskError{Code: "INVALID_OUTPUT", Message: "the handler's output is not JSON: " + err.Error(), Err: err}
	}
	if surelyWithin(value, minOffload) {
		return value, nil
	}
	threshold, err := w.client.offloadThreshold(a.ctx)
	if err != nil {
		// The report that follows meets the same server: it tells.
		a.task.Logger.Warn("composer could not ask the server's offload threshold; reporting the output inline", "error", err)
		return value, nil
	}
	if threshold <= 0 || surelyWithin(value, max(threshold, minOffload)) {
		return value, nil
	}
	data, err := compactJSON(value)
	if err != nil {
		return nil, &TaskError{Code: "INVALID_OUTPUT", Message: "the handler's output is not JSON: " + err.Error(), Err: err}
	}
	if int64(len(data)) <= max(threshold, minOffload) {
		return value, nil
	}
	ref, err := w.uploadOutput(a, data)
	switch {
	case err == nil:
		a.task.Logger.Debug("composer output uploaded to the blob store", "sha256", ref.SHA256, "size", ref.Size)
		return ref.value(), nil
	case a.ctx.Err() != nil:
		return nil, err // the context's cause says why
	case IsResourceExhausted(err) && !isBusy(err):
		e, _ := AsError(err)
		return nil, &TaskError{Code: "OUTPUT_TOO_LARGE", Message: "output too large: " + e.Message, Err: err}
	}
	return nil, &TaskError{Code: "OUTPUT_UPLOAD_FAILED", Message: "could not upload the output: " + err.Error(), Retryable: IsRetryable(err) || isBusy(err), Err: err}
}

// uploadOutput uploads an output, again after UNAVAILABLE,
// DEADLINE_EXCEEDED or a busy server (see retryDelay; the same bytes are the
// same blob), for up to ReportTimeout.
func (w *Worker) uploadOutput(a *attempt, data []byte) (BlobRef, error) {
	deadline := time.Now().Add(w.opts.ReportTimeout)
	for failures := 1; ; failures++ {
		ref, err := w.client.UploadBlob(a.ctx, data)
		if err == nil || a.ctx.Err() != nil || time.Now().After(deadline) {
			return ref, err
		}
		delay, again := w.retryDelay(err, failures)
		if !again {
			return ref, err
		}
		a.task.Logger.Info("composer output upload failed; uploading it again", "error", err, "delay", delay)
		if !sleepCtx(a.ctx, delay) {
			return ref, err
		}
	}
}
