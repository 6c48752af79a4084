package composer

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	pb "github.com/composer-dev/composer/sdks/go/gen/composer/v1"
)

// DefaultAddress is where composer serve and composer dev listen by default.
const DefaultAddress = "127.0.0.1:7070"

// The protocol version this SDK speaks: any server of major ProtocolMajor
// with a minor of at least ProtocolMinor.
const (
	ProtocolMajor = 1
	ProtocolMinor = 0
)

// Client is a connection to a Composer server: it registers workflows,
// starts and steers runs, sends events and waits for results. It is safe for
// concurrent use; make one per process and Close it at the end. A Worker
// uses a Client's connection.
type Client struct {
	conn      *grpc.ClientConn
	address   string
	token     string
	timeout   time.Duration
	logger    *slog.Logger
	workflows pb.WorkflowServiceClient
	runs      pb.RunServiceClient
	schedules pb.ScheduleServiceClient
	queues    pb.QueueServiceClient
	secrets   pb.SecretServiceClient
	workers   pb.WorkerServiceClient
	server    pb.ServerServiceClient
	blobs     pb.BlobServiceClient
	// serverInfoCache holds the last ServerInfo (the offload threshold,
	// BlobURLs).
	serverInfoCache
	// blobURLState says whether the server stopped giving blob URLs.
	blobURLState
}

type options struct {
	token        *string
	tls          *tls.Config
	timeout      time.Duration
	logger       *slog.Logger
	dialOptions  []grpc.DialOption
	interceptors []grpc.UnaryClientInterceptor
}

// Option configures Dial.
type Option func(*options)

// WithToken sets the bearer token sent with every call (a JWT from
// `composer token`). Without it Dial reads COMPOSER_TOKEN; an empty token
// sends none.
func WithToken(token string) Option { return func(o *options) { o.token = &token } }

// WithTLS connects with TLS (nil: the system's roots). Without it the
// connection is plaintext, as composer dev serves, unless the address is
// https://host:port.
func WithTLS(config *tls.Config) Option {
	return func(o *options) {
		if config == nil {
			config = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		o.tls = config
	}
}

// WithTimeout sets the deadline of each Client call whose context has none
// (default 30 s). It does not apply to WatchRun and the waits.
func WithTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// WithLogger sets the logger of the Client and of its Workers (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithDialOptions adds grpc.DialOptions (interceptors, stats handlers, ...).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOptions = append(o.dialOptions, opts...) }
}

// WithUnaryInterceptor adds a unary client interceptor to every call.
func WithUnaryInterceptor(i grpc.UnaryClientInterceptor) Option {
	return func(o *options) { o.interceptors = append(o.interceptors, i) }
}

// Dial makes a Client for the server at address: `host:port` (plaintext,
// or TLS with WithTLS), `http://host:port` (plaintext) or
// `https://host:port` (TLS with the system's roots, or WithTLS's config);
// empty means COMPOSER_ADDRESS, else DefaultAddress. A malformed address is
// an error at once. The token is WithToken's, else COMPOSER_TOKEN's. Dial
// does not wait for the server: the first call connects (ServerInfo and
// CheckProtocol check it). ctx is not retained.
func Dial(ctx context.Context, address string, opts ...Option) (*Client, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	o := options{timeout: 30 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	if address == "" {
		address = os.Getenv("COMPOSER_ADDRESS")
	}
	if address == "" {
		address = DefaultAddress
	}
	parsed, err := parseAddress(address, o.tls != nil)
	if err != nil {
		return nil, err
	}
	if parsed.tls && o.tls == nil {
		o.tls = &tls.Config{MinVersion: tls.VersionTLS12} // the system's roots
	}
	token := os.Getenv("COMPOSER_TOKEN")
	if o.token != nil {
		token = *o.token
	}
	if o.logger == nil {
		o.logger = slog.Default()
	}
	creds := insecure.NewCredentials()
	if o.tls != nil {
		creds = credentials.NewTLS(o.tls)
	}
	dial := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		// Reconnect quickly after a server restart.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64 << 20)),
		// Fixed flow-control windows, large enough for any message this SDK
		// receives in one go: they turn off gRPC's bandwidth-delay probing,
		// which pings the server (and sends a window update) about once a
		// round trip on a busy connection such as a worker's.
		grpc.WithStaticStreamWindowSize(8 << 20),
		grpc.WithStaticConnWindowSize(16 << 20),
	}
	if len(o.interceptors) > 0 {
		dial = append(dial, grpc.WithChainUnaryInterceptor(o.interceptors...))
	}
	dial = append(dial, o.dialOptions...)
	conn, err := grpc.NewClient(parsed.target, dial...)
	if err != nil {
		return nil, fmt.Errorf("composer: dial %s: %w", address, err)
	}
	return &Client{
		conn: conn, address: address, token: token, timeout: o.timeout, logger: o.logger,
		workflows: pb.NewWorkflowServiceClient(conn), runs: pb.NewRunServiceClient(conn),
		workers: pb.NewWorkerServiceClient(conn), server: pb.NewServerServiceClient(conn),
		schedules: pb.NewScheduleServiceClient(conn), queues: pb.NewQueueServiceClient(conn),
		secrets: pb.NewSecretServiceClient(conn), blobs: pb.NewBlobServiceClient(conn),
	}, nil
}

// Address is the server's address.
func (c *Client) Address() string { return c.address }

// Close closes the connection; calls still running fail.
func (c *Client) Close() error { return c.conn.Close() }

// Conn is the underlying gRPC connection, for the generated clients of
// gen/composer/v1 (the wire layer). Calls made on it carry no token unless
// the caller adds one (see OutgoingContext).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// OutgoingContext returns ctx with the Client's bearer token in the
// outgoing gRPC metadata, for raw calls on Conn.
func (c *Client) OutgoingContext(ctx context.Context) context.Context {
	if c.token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.token)
}

// callContext adds the token and, when ctx has no deadline, the default timeout.
func (c *Client) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx = c.OutgoingContext(ctx)
	if _, ok := ctx.Deadline(); !ok && c.timeout > 0 {
		return context.WithTimeout(ctx, c.timeout)
	}
	return ctx, func() {}
}

// waitForReady makes a Client call made while the server restarts wait for
// it (within the call's deadline) rather than fail UNAVAILABLE at once.
var waitForReady = grpc.WaitForReady(true)

// ServerInfo asks the server for its version, protocol version, features
// and payload limits. CheckProtocol also checks that this SDK can speak the
// protocol. The Client keeps the answer's PayloadOffloadBytes for the
// calls that offload large payloads (asking once, when first needed).
func (c *Client) ServerInfo(ctx context.Context) (*ServerInfo, error) {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.server.GetServerInfo(ctx, &pb.GetServerInfoRequest{}, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	info := serverInfoFrom(r)
	c.remember(info)
	return info, nil
}

// CheckProtocol asks the server for its protocol version (ServerInfo) and
// fails with FAILED_PRECONDITION, returning the info too, when this SDK
// cannot speak it. A Worker makes this check before it polls.
func (c *Client) CheckProtocol(ctx context.Context) (*ServerInfo, error) {
	info, err := c.ServerInfo(ctx)
	if err != nil {
		return nil, err
	}
	if err := CheckProtocolVersion(info.ProtocolVersion); err != nil {
		return info, fmt.Errorf("composer: server %s: %w", c.address, err)
	}
	return info, nil
}

// CheckProtocolVersion returns an *Error (FAILED_PRECONDITION) unless this
// SDK can speak the protocol version ("<major>.<minor>") a server announces.
func CheckProtocolVersion(version string) error {
	majorText, minorText, _ := strings.Cut(version, ".")
	major, err1 := strconv.Atoi(majorText)
	minor, err2 := strconv.Atoi(minorText)
	if minorText == "" {
		minor, err2 = 0, nil
	}
	if err1 != nil || err2 != nil || major != ProtocolMajor || minor < ProtocolMinor {
		return &Error{Code: codes.FailedPrecondition, Message: fmt.Sprintf("the server speaks protocol %q; this SDK needs %d.x with x >= %d", version, ProtocolMajor, ProtocolMinor)}
	}
	return nil
}

// Source is a workflow definition to register or validate: YAML(text),
// File(path) or Definition(value).
type Source interface {
	text() (string, error)
}

type yamlSource []byte

func (s yamlSource) text() (string, error) { return string(s), nil }

type fileSource string

func (s fileSource) text() (string, error) {
	b, err := os.ReadFile(string(s))
	if err != nil {
		return "", fmt.Errorf("composer: read workflow: %w", err)
	}
	return string(b), nil
}

type valueSource struct{ v any }

func (s valueSource) text() (string, error) {
	b, err := json.Marshal(s.v)
	if err != nil {
		return "", fmt.Errorf("composer: encode workflow: %w", err)
	}
	return string(b), nil
}

// YAML is a definition given as YAML (or JSON) text.
func YAML(text []byte) Source { return yamlSource(text) }

// File is a definition read from a YAML or JSON file.
func File(path string) Source { return fileSource(path) }

// Definition is a definition given as a Go value (a struct with json tags,
// or a map), sent as JSON, which is YAML.
func Definition(v any) Source { return valueSource{v} }

// RegisterWorkflow registers a definition. Identical content to the newest
// version returns that version with Created false. An invalid definition
// fails with INVALID_ARGUMENT and one FieldViolation per problem.
func (c *Client) RegisterWorkflow(ctx context.Context, src Source) (*WorkflowVersion, error) {
	text, err := src.text()
	if err != nil {
		return nil, err
	}
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.workflows.RegisterWorkflow(ctx, &pb.RegisterWorkflowRequest{Source: text}, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	return workflowFrom(r.GetWorkflow(), r.GetCreated()), nil
}

// ValidateWorkflow checks a definition as RegisterWorkflow does, stores
// nothing, and returns every problem (none when it is valid).
func (c *Client) ValidateWorkflow(ctx context.Context, src Source) ([]ValidationProblem, error) {
	text, err := src.text()
	if err != nil {
		return nil, err
	}
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.workflows.ValidateWorkflow(ctx, &pb.ValidateWorkflowRequest{Source: text}, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	problems := []ValidationProblem{}
	for _, p := range r.GetProblems() {
		problems = append(problems, ValidationProblem{Path: p.GetPath(), Message: p.GetMessage()})
	}
	return problems, nil
}

// ListWorkflowsOptions selects the workflows ListWorkflows returns.
type ListWorkflowsOptions struct {
	// NamePrefix: only workflows whose name starts with it.
	NamePrefix string
	// PageSize is the number of workflows fetched per call (default 100, at
	// most 1000).
	PageSize int
}

// ListWorkflows iterates over the namespace's workflows, by name, one
// summary each (its latest version), fetching page after page. Iteration
// stops at the first error, which it yields.
func (c *Client) ListWorkflows(ctx context.Context, opts ListWorkflowsOptions) iter.Seq2[*WorkflowSummary, error] {
	return paged(ctx, c, func(ctx context.Context, token string) ([]*WorkflowSummary, string, error) {
		r, err := c.workflows.ListWorkflows(ctx, &pb.ListWorkflowsRequest{
			NamePrefix: opts.NamePrefix, PageSize: int32(opts.PageSize), PageToken: token,
		}, waitForReady)
		return convertAll(r.GetWorkflows(), workflowSummaryFrom), r.GetNextPageToken(), err
	})
}

// ListWorkflowVersions iterates over the versions of the workflow name,
// newest first, pageSize per call (0: the server's default, 100), without
// their Source (GetWorkflow has it). It yields NOT_FOUND when no workflow
// has that name. Iteration stops at the first error, which it yields.
func (c *Client) ListWorkflowVersions(ctx context.Context, name string, pageSize int) iter.Seq2[*WorkflowVersion, error] {
	return paged(ctx, c, func(ctx context.Context, token string) ([]*WorkflowVersion, string, error) {
		r, err := c.workflows.ListWorkflowVersions(ctx, &pb.ListWorkflowVersionsRequest{
			Name: name, PageSize: int32(pageSize), PageToken: token,
		}, waitForReady)
		return convertAll(r.GetVersions(), listedWorkflowFrom), r.GetNextPageToken(), err
	})
}

// GetWorkflow returns one version of a workflow (the latest for version 0).
func (c *Client) GetWorkflow(ctx context.Context, name string, version int) (*WorkflowVersion, error) {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.workflows.GetWorkflow(ctx, &pb.GetWorkflowRequest{Name: name, Version: int32(version)}, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	return workflowFrom(r.GetWorkflow(), false), nil
}

type startOptions struct {
	version  int
	key      string
	labels   map[string]string
	priority int
}

// StartOption configures StartRun.
type StartOption func(*startOptions)

// WithIdempotencyKey makes a repeated StartRun with the same key return the
// run the first one created (Run.Created false) and start nothing.
func WithIdempotencyKey(key string) StartOption { return func(o *startOptions) { o.key = key } }

// WithLabels attaches labels to the run, for ListRuns filters.
func WithLabels(labels map[string]string) StartOption {
	return func(o *startOptions) { o.labels = labels }
}

// WithVersion pins the run to a workflow version (default: the latest).
func WithVersion(version int) StartOption { return func(o *startOptions) { o.version = version } }

// WithPriority sets the run's dispatch priority, 1 (lowest) to 5 (highest);
// 0 is the default, 3. A waiting task of a higher-priority run is handed to
// workers first. Outside 0-5 StartRun fails INVALID_ARGUMENT naming
// `priority`. Child runs inherit it.
func WithPriority(priority int) StartOption { return func(o *startOptions) { o.priority = priority } }

// StartRun starts a run of workflow with input (any JSON-encodable value;
// nil is null). An input whose compact JSON is longer than the server's
// PayloadOffloadBytes is uploaded first (UploadBlob) and the run gets its
// reference. NOT_FOUND when the workflow does not exist. When ctx holds
// an OpenTelemetry span, the call carries its W3C trace context
// (traceparent), so the run's trace continues the caller's.
func (c *Client) StartRun(ctx context.Context, workflow string, input any, opts ...StartOption) (*Run, error) {
	var o startOptions
	for _, opt := range opts {
		opt(&o)
	}
	value, err := toValue(input)
	if err != nil {
		return nil, fmt.Errorf("composer: encode run input: %w", err)
	}
	if value, err = c.offloadArgument(ctx, value, "the run input"); err != nil {
		return nil, err
	}
	ctx, cancel := c.callContext(withTraceMetadata(ctx, traceMetadata(ctx)))
	defer cancel()
	r, err := c.runs.StartRun(ctx, &pb.StartRunRequest{
		WorkflowName: workflow, Version: int32(o.version), Input: value, IdempotencyKey: o.key, Labels: o.labels,
		Priority: int32(o.priority),
	}, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	run := runFrom(r.GetRun())
	run.Created = r.GetCreated()
	return run, nil
}

// GetRun returns a run with its node states. NOT_FOUND for an unknown id.
// Inputs and outputs show blob references as stored (ResolvePayload reads
// them).
func (c *Client) GetRun(ctx context.Context, runID string) (*Run, error) {
	return c.getRun(ctx, runID, false)
}

func (c *Client) getRun(ctx context.Context, runID string, skipNodes bool) (*Run, error) {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.runs.GetRun(ctx, &pb.GetRunRequest{RunId: runID, SkipNodes: skipNodes}, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	return runFrom(r.GetRun()), nil
}

// RunFilter selects runs for ListRuns and the bulk operations
// (BulkCancelRuns, ...); zero fields do not filter. A bad field is
// INVALID_ARGUMENT naming it (filter.<field> in a bulk operation).
type RunFilter struct {
	// Workflow: only runs of this workflow.
	Workflow string
	// WorkflowVersion: only runs of this version of Workflow (which it
	// requires); 0 means any version.
	WorkflowVersion int
	// Statuses: only runs in one of these statuses.
	Statuses []RunStatus
	// Labels: only runs carrying all of these labels with these values.
	Labels map[string]string
	// CreatedAfter: only runs created at or after this time.
	CreatedAfter time.Time
	// CreatedBefore: only runs created before this time.
	CreatedBefore time.Time
	// ParentRunID: only child runs of this run.
	ParentRunID string
	// Search: only the run whose id it is and runs whose idempotency key
	// starts with it (at most 256 bytes).
	Search string
	// PageSize is the number of runs ListRuns fetches per call (default
	// 100); the bulk operations ignore it.
	PageSize int
}

// ListRuns iterates over the runs matching filter, newest first, fetching
// page after page. Iteration stops at the first error, which it yields.
func (c *Client) ListRuns(ctx context.Context, filter RunFilter) iter.Seq2[*Run, error] {
	f := filter.proto()
	return paged(ctx, c, func(ctx context.Context, token string) ([]*Run, string, error) {
		r, err := c.runs.ListRuns(ctx, &pb.ListRunsRequest{
			WorkflowName: f.WorkflowName, WorkflowVersion: f.WorkflowVersion, Statuses: f.Statuses,
			Labels: f.Labels, CreateTimeAfter: f.CreateTimeAfter, CreateTimeBefore: f.CreateTimeBefore,
			ParentRunId: f.ParentRunId, Search: f.Search, PageSize: int32(filter.PageSize), PageToken: token,
		}, waitForReady)
		return convertAll(r.GetRuns(), runFrom), r.GetNextPageToken(), err
	})
}

// CountRuns counts the runs matching filter by status, in one call. The
// filter's fields are ListRuns' (its PageSize is ignored); with Statuses
// set, only those statuses are counted. A status without runs is absent
// from the counts (reads as 0). The server counts up to its limit
// (100,000 matching runs): past it each count is a floor, and More is set.
func (c *Client) CountRuns(ctx context.Context, filter RunFilter) (RunCounts, error) {
	f := filter.proto()
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.runs.CountRuns(ctx, &pb.CountRunsRequest{
		WorkflowName: f.WorkflowName, WorkflowVersion: f.WorkflowVersion, Labels: f.Labels,
		CreateTimeAfter: f.CreateTimeAfter, CreateTimeBefore: f.CreateTimeBefore,
		ParentRunId: f.ParentRunId, Search: f.Search,
	}, waitForReady)
	if err != nil {
		return RunCounts{}, convertError(err)
	}
	counts := RunCounts{ByStatus: map[RunStatus]int64{}, More: r.GetMore()}
	for _, sc := range r.GetCounts() {
		status := RunStatus(sc.GetStatus())
		if len(filter.Statuses) > 0 && !slices.Contains(filter.Statuses, status) {
			continue
		}
		counts.ByStatus[status] += sc.GetCount()
	}
	return counts, nil
}

// CancelRun cancels a running run: its tasks' handlers see their context
// done with a *RunCancelledError carrying reason (CancelReason), and
// WaitForResult / RunWorkflow return a *RunFailedError with code CANCELLED
// and reason as message. FAILED_PRECONDITION if it already ended.
func (c *Client) CancelRun(ctx context.Context, runID, reason string) (*Run, error) {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.runs.CancelRun(ctx, &pb.CancelRunRequest{RunId: runID, Reason: reason}, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	return runFrom(r.GetRun()), nil
}

// RetryRun resumes a FAILED run from its failed nodes. FAILED_PRECONDITION
// unless the run is FAILED.
func (c *Client) RetryRun(ctx context.Context, runID string) (*Run, error) {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.runs.RetryRun(ctx, &pb.RetryRunRequest{RunId: runID}, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	return runFrom(r.GetRun()), nil
}

// PauseRun pauses a live run: from then on it dispatches no new task and
// fires no timer. Attempts already running finish and their results are
// applied, but the tasks they make ready are held until ResumeRun; the run
// shows RunPaused. Child runs go on. Pausing a paused run changes nothing;
// FAILED_PRECONDITION when the run already ended.
func (c *Client) PauseRun(ctx context.Context, runID, reason string) (*Run, error) {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.runs.PauseRun(ctx, &pb.PauseRunRequest{RunId: runID, Reason: reason}, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	return runFrom(r.GetRun()), nil
}

// ResumeRun undoes PauseRun: held tasks are dispatched, timers that fell due
// fire, and the run shows its status from before the pause. Resuming a run
// that is not paused changes nothing; FAILED_PRECONDITION when it ended.
func (c *Client) ResumeRun(ctx context.Context, runID string) (*Run, error) {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.runs.ResumeRun(ctx, &pb.ResumeRunRequest{RunId: runID}, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	return runFrom(r.GetRun()), nil
}

// Event is an event for SendEvent: Name and Payload, sent to one run
// (RunID) or to every run waiting on a correlation key (CorrelationKey).
type Event struct {
	Name string
	// Payload (JSON-encodable) becomes the WAIT_FOR_EVENT node's output.
	Payload        any
	RunID          string
	CorrelationKey string
	// RequestID makes a repeated SendEvent deliver nothing new.
	RequestID string
}

// SendEvent delivers an event. Exactly one of RunID and CorrelationKey must
// be set. Like StartRun, it uploads a payload larger than the server's
// PayloadOffloadBytes and sends its reference, and carries the trace
// context of ctx's span.
func (c *Client) SendEvent(ctx context.Context, event Event) (*EventDelivery, error) {
	if (event.RunID == "") == (event.CorrelationKey == "") {
		return nil, errors.New("composer: an Event needs exactly one of RunID and CorrelationKey")
	}
	payload, err := toValue(event.Payload)
	if err != nil {
		return nil, fmt.Errorf("composer: encode event payload: %w", err)
	}
	if payload, err = c.offloadArgument(ctx, payload, "the event payload"); err != nil {
		return nil, err
	}
	req := &pb.SendEventRequest{EventName: event.Name, Payload: payload, RequestId: event.RequestID}
	if event.RunID != "" {
		req.Target = &pb.SendEventRequest_RunId{RunId: event.RunID}
	} else {
		req.Target = &pb.SendEventRequest_CorrelationKey{CorrelationKey: event.CorrelationKey}
	}
	ctx, cancel := c.callContext(withTraceMetadata(ctx, traceMetadata(ctx)))
	defer cancel()
	r, err := c.runs.SendEvent(ctx, req, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	return &EventDelivery{DeliveredRunIDs: r.GetDeliveredRunIds(), Stored: r.GetStored()}, nil
}

// GetRunHistory iterates over a run's history, oldest first, page after
// page (Python's get_run_history, TypeScript's getRunHistory).
func (c *Client) GetRunHistory(ctx context.Context, runID string) iter.Seq2[*HistoryEvent, error] {
	return c.History(ctx, runID)
}

// History is GetRunHistory, under the name it first had.
//
// Deprecated: use GetRunHistory, the name the other SDKs share.
func (c *Client) History(ctx context.Context, runID string) iter.Seq2[*HistoryEvent, error] {
	return paged(ctx, c, func(ctx context.Context, token string) ([]*HistoryEvent, string, error) {
		r, err := c.runs.GetRunHistory(ctx, &pb.GetRunHistoryRequest{RunId: runID, PageSize: 500, PageToken: token}, waitForReady)
		return convertAll(r.GetEvents(), historyFrom), r.GetNextPageToken(), err
	})
}

// WatchRun iterates over snapshots of a run: the current one first, then one
// after every change, ending after the snapshot with a final status. A
// stream broken by the network or a server restart is opened again (with
// back-off); other errors, and ctx's end, are yielded and end the iteration.
func (c *Client) WatchRun(ctx context.Context, runID string) iter.Seq2[*Run, error] {
	return func(yield func(*Run, error) bool) {
		failures := 0
		for {
			stream, err := c.runs.WatchRun(c.OutgoingContext(ctx), &pb.WatchRunRequest{RunId: runID}, waitForReady)
			for err == nil {
				var msg *pb.WatchRunResponse
				msg, err = stream.Recv()
				if err != nil {
					break
				}
				failures = 0
				run := runFrom(msg.GetRun())
				if !yield(run, nil) {
					return
				}
				if run.Status.IsFinal() {
					return
				}
			}
			if ctxErr := ctx.Err(); ctxErr != nil {
				yield(nil, fmt.Errorf("composer: watching run %s: %w", runID, context.Cause(ctx)))
				return
			}
			converted := convertError(err)
			if err != io.EOF && !IsRetryable(converted) {
				yield(nil, converted)
				return
			}
			failures++
			c.logger.Debug("composer: watch stream broken; reopening", "run_id", runID, "error", err)
			if !sleepCtx(ctx, DefaultBackoff.Delay(failures)) {
				yield(nil, fmt.Errorf("composer: watching run %s: %w", runID, context.Cause(ctx)))
				return
			}
		}
	}
}

// WaitForRun waits (over WatchRun) until the run ends and returns it,
// whatever its final status, its values as stored (blob references
// included: WaitForResult resolves the output). When ctx ends first the
// error wraps ctx's (errors.Is(err, context.DeadlineExceeded) for a
// timeout).
func (c *Client) WaitForRun(ctx context.Context, runID string) (*Run, error) {
	for run, err := range c.WatchRun(ctx, runID) {
		if err != nil {
			return nil, err
		}
		if run.Status.IsFinal() {
			return run, nil
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("composer: waiting for run %s: %w", runID, err)
	}
	return nil, fmt.Errorf("composer: the watch of run %s ended before the run did", runID)
}

// WaitForResult waits until the run ends and decodes its output into out (a
// pointer, as for json.Unmarshal; nil skips decoding), every blob reference
// in it resolved (ResolvePayload). A run that ended FAILED or CANCELLED
// returns a *RunFailedError carrying it.
func (c *Client) WaitForResult(ctx context.Context, runID string, out any) error {
	run, err := c.WaitForRun(ctx, runID)
	if err != nil {
		return err
	}
	if out != nil {
		if run, err = c.resolveOutput(ctx, run); err != nil {
			return err
		}
	}
	return resultOf(run, out)
}

// RunWorkflow starts a run of workflow with input and waits for its result
// (StartRun, then WaitForResult): it decodes the output into out (a
// pointer; nil skips decoding) and returns the final run, whose Output has
// its blob references resolved as out's. A run that ended FAILED or
// CANCELLED returns it with a *RunFailedError; when ctx ends first the
// error wraps ctx's (errors.Is(err, context.DeadlineExceeded) for a
// timeout), and the run, once started, goes on.
func (c *Client) RunWorkflow(ctx context.Context, workflow string, input, out any, opts ...StartOption) (*Run, error) {
	started, err := c.StartRun(ctx, workflow, input, opts...)
	if err != nil {
		return nil, err
	}
	run, err := c.WaitForRun(ctx, started.ID)
	if err != nil {
		return nil, err
	}
	if run, err = c.resolveOutput(ctx, run); err != nil {
		return nil, err
	}
	return run, resultOf(run, out)
}

// resultOf decodes a final run's output into out, or says why it has none.
func resultOf(run *Run, out any) error {
	if run.Status != RunCompleted {
		return &RunFailedError{Run: run}
	}
	if out == nil {
		return nil
	}
	if err := run.DecodeOutput(out); err != nil {
		return fmt.Errorf("composer: decode the output of run %s: %w", run.ID, err)
	}
	return nil
}

// sleepCtx sleeps for d unless ctx ends first (then false).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
