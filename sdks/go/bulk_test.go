package composer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/composer-dev/composer/sdks/go/gen/composer/v1"
)

// fakeBulk is a RunService on a loopback port that answers the bulk
// operations from a script and records every request.
type fakeBulk struct {
	pb.UnimplementedRunServiceServer

	mu       sync.Mutex
	requests []proto.Message
	// err, when set, answers every call.
	err error
	// statuses are what the next GetBulkOperation calls answer, in order;
	// the last one repeats.
	statuses []pb.BulkOperationStatus
	gets     int
	// pages are ListBulkOperations' pages: page i's token is "page-i".
	pages [][]*pb.BulkOperation
}

func startFakeBulk(t *testing.T) (*fakeBulk, *Client) {
	t.Helper()
	f := &fakeBulk{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pb.RegisterRunServiceServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	client, err := Dial(context.Background(), lis.Addr().String(), WithToken(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.Close()
		srv.Stop()
	})
	return f, client
}

func (f *fakeBulk) record(req proto.Message) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, req)
	return f.err
}

func (f *fakeBulk) recorded() []proto.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]proto.Message(nil), f.requests...)
}

func fakeOperation(kind pb.BulkOperationKind, st pb.BulkOperationStatus) *pb.BulkOperation {
	return &pb.BulkOperation{OperationId: "op-1", Namespace: "default", Kind: kind, Status: st}
}

func (f *fakeBulk) BulkCancelRuns(_ context.Context, req *pb.BulkCancelRunsRequest) (*pb.BulkCancelRunsResponse, error) {
	if err := f.record(req); err != nil {
		return nil, err
	}
	op := fakeOperation(pb.BulkOperationKind_BULK_OPERATION_KIND_CANCEL, pb.BulkOperationStatus_BULK_OPERATION_STATUS_PENDING)
	op.Filter, op.Reason = req.GetFilter(), req.GetReason()
	return &pb.BulkCancelRunsResponse{Operation: op, Created: true}, nil
}

func (f *fakeBulk) BulkRetryRuns(_ context.Context, req *pb.BulkRetryRunsRequest) (*pb.BulkRetryRunsResponse, error) {
	if err := f.record(req); err != nil {
		return nil, err
	}
	op := fakeOperation(pb.BulkOperationKind_BULK_OPERATION_KIND_RETRY, pb.BulkOperationStatus_BULK_OPERATION_STATUS_RUNNING)
	return &pb.BulkRetryRunsResponse{Operation: op, Created: false}, nil
}

func (f *fakeBulk) BulkPauseRuns(_ context.Context, req *pb.BulkPauseRunsRequest) (*pb.BulkPauseRunsResponse, error) {
	if err := f.record(req); err != nil {
		return nil, err
	}
	op := fakeOperation(pb.BulkOperationKind_BULK_OPERATION_KIND_PAUSE, pb.BulkOperationStatus_BULK_OPERATION_STATUS_PENDING)
	return &pb.BulkPauseRunsResponse{Operation: op, Created: true}, nil
}

func (f *fakeBulk) BulkResumeRuns(_ context.Context, req *pb.BulkResumeRunsRequest) (*pb.BulkResumeRunsResponse, error) {
	if err := f.record(req); err != nil {
		return nil, err
	}
	op := fakeOperation(pb.BulkOperationKind_BULK_OPERATION_KIND_RESUME, pb.BulkOperationStatus_BULK_OPERATION_STATUS_PENDING)
	return &pb.BulkResumeRunsResponse{Operation: op, Created: true}, nil
}

func (f *fakeBulk) MigrateRuns(_ context.Context, req *pb.MigrateRunsRequest) (*pb.MigrateRunsResponse, error) {
	if err := f.record(req); err != nil {
		return nil, err
	}
	op := fakeOperation(pb.BulkOperationKind_BULK_OPERATION_KIND_MIGRATE, pb.BulkOperationStatus_BULK_OPERATION_STATUS_PENDING)
	op.Filter, op.TargetVersion, op.NodeMapping = req.GetFilter(), req.GetTargetVersion(), req.GetNodeMapping()
	return &pb.MigrateRunsResponse{Operation: op, Created: true}, nil
}

func (f *fakeBulk) GetBulkOperation(_ context.Context, req *pb.GetBulkOperationRequest) (*pb.GetBulkOperationResponse, error) {
	if err := f.record(req); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	st := pb.BulkOperationStatus_BULK_OPERATION_STATUS_RUNNING
	if len(f.statuses) > 0 {
		st = f.statuses[min(f.gets, len(f.statuses)-1)]
	}
	f.gets++
	op := fakeOperation(pb.BulkOperationKind_BULK_OPERATION_KIND_RETRY, st)
	op.OperationId = req.GetOperationId()
	return &pb.GetBulkOperationResponse{Operation: op}, nil
}

func (f *fakeBulk) ListBulkOperations(_ context.Context, req *pb.ListBulkOperationsRequest) (*pb.ListBulkOperationsResponse, error) {
	if err := f.record(req); err != nil {
		return nil, err
	}
	page := 0
	if req.GetPageToken() != "" {
		if _, err := fmt.Sscanf(req.GetPageToken(), "page-%d", &page); err != nil {
			return nil, status.Error(codes.InvalidArgument, "bad page token")
		}
	}
	resp := &pb.ListBulkOperationsResponse{Operations: f.pages[page]}
	if page+1 < len(f.pages) {
		resp.NextPageToken = fmt.Sprintf("page-%d", page+1)
	}
	return resp, nil
}

func (f *fakeBulk) CancelBulkOperation(_ context.Context, req *pb.CancelBulkOperationRequest) (*pb.CancelBulkOperationResponse, error) {
	if err := f.record(req); err != nil {
		return nil, err
	}
	op := fakeOperation(pb.BulkOperationKind_BULK_OPERATION_KIND_CANCEL, pb.BulkOperationStatus_BULK_OPERATION_STATUS_CANCELLED)
	op.OperationId = req.GetOperationId()
	return &pb.CancelBulkOperationResponse{Operation: op}, nil
}

// Each bulk call sends the filter's every field, all, reason and
// request_id as the RPC has them, and reads the operation and created.
func TestBulkCallsMapTheirRequestsAndAnswers(t *testing.T) {
	f, client := startFakeBulk(t)
	ctx := context.Background()
	after, before := time.Unix(1_700_000_000, 0).UTC(), time.Unix(1_800_000_000, 0).UTC()
	filter := RunFilter{
		Workflow: "order", WorkflowVersion: 2, Statuses: []RunStatus{RunFailed, RunPaused},
		Labels: map[string]string{"shop": "eu"}, CreatedAfter: after, CreatedBefore: before,
		ParentRunID: "parent-1", Search: "key-", PageSize: 7,
	}
	wantFilter := &pb.RunFilter{
		WorkflowName: "order", WorkflowVersion: 2,
		Statuses: []pb.RunStatus{pb.RunStatus_RUN_STATUS_FAILED, pb.RunStatus_RUN_STATUS_PAUSED},
		Labels:   map[string]string{"shop": "eu"}, CreateTimeAfter: timestamppb.New(after),
		CreateTimeBefore: timestamppb.New(before), ParentRunId: "parent-1", Search: "key-",
	}

	cancelled, err := client.BulkCancelRuns(ctx, filter, "outage", WithAllRuns(), WithRequestID("req-1"))
	if err != nil {
		t.Fatal(err)
	}
	if cancelled.ID != "op-1" || cancelled.Kind != BulkKindCancel || cancelled.Status != BulkPending ||
		!cancelled.Created || cancelled.Reason != "outage" || cancelled.Kind.String() != "CANCEL" {
		t.Errorf("cancel answered %+v", cancelled)
	}
	back := filter
	back.PageSize = 0
	if fmt.Sprint(cancelled.Filter) != fmt.Sprint(back) {
		t.Errorf("the operation's filter reads back as %+v, want %+v", cancelled.Filter, back)
	}
	retried, err := client.BulkRetryRuns(ctx, RunFilter{Labels: map[string]string{"a": "b"}}, WithRequestID("req-2"))
	if err != nil || retried.Kind != BulkKindRetry || retried.Status != BulkRunning || retried.Created {
		t.Errorf("retry answered %+v, %v", retried, err)
	}
	if _, err := client.BulkPauseRuns(ctx, RunFilter{Workflow: "order"}, "hold"); err != nil {
		t.Fatal(err)
	}
	if _, err := client.BulkResumeRuns(ctx, RunFilter{}, WithAllRuns()); err != nil {
		t.Fatal(err)
	}

	want := []proto.Message{
		&pb.BulkCancelRunsRequest{Filter: wantFilter, All: true, Reason: "outage", RequestId: "req-1"},
		&pb.BulkRetryRunsRequest{Filter: &pb.RunFilter{Labels: map[string]string{"a": "b"}}, RequestId: "req-2"},
		&pb.BulkPauseRunsRequest{Filter: &pb.RunFilter{WorkflowName: "order"}, Reason: "hold"},
		&pb.BulkResumeRunsRequest{Filter: &pb.RunFilter{}, All: true},
	}
	got := f.recorded()
	if len(got) != len(want) {
		t.Fatalf("%d requests, want %d", len(got), len(want))
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("request %d: %v, want %v", i, got[i], want[i])
		}
	}
}

// ListRuns sends the filter's version and search too.
func TestListRunsSendsEveryFilterField(t *testing.T) {
	var seen *pb.ListRunsRequest
	runs := &listRecorder{seen: func(r *pb.ListRunsRequest) { seen = r }}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pb.RegisterRunServiceServer(srv, runs)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	client, err := Dial(context.Background(), lis.Addr().String(), WithToken(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	for _, err := range client.ListRuns(context.Background(), RunFilter{Workflow: "w", WorkflowVersion: 3, Search: "abc", PageSize: 5}) {
		t.Fatal(err)
	}
	want := &pb.ListRunsRequest{WorkflowName: "w", WorkflowVersion: 3, Search: "abc", PageSize: 5}
	if !proto.Equal(seen, want) {
		t.Errorf("ListRuns sent %v, want %v", seen, want)
	}
}

type listRecorder struct {
	pb.UnimplementedRunServiceServer
	seen func(*pb.ListRunsRequest)
}

func (l *listRecorder) ListRuns(_ context.Context, req *pb.ListRunsRequest) (*pb.ListRunsResponse, error) {
	l.seen(req)
	return &pb.ListRunsResponse{}, nil
}

// ListBulkOperations pages with the page size and the tokens given.
func TestListBulkOperationsPagesThroughEveryOperation(t *testing.T) {
	f, client := startFakeBulk(t)
	f.pages = [][]*pb.BulkOperation{
		{{OperationId: "c"}, {OperationId: "b"}},
		{{OperationId: "a"}},
	}
	var ids []string
	for op, err := range client.ListBulkOperations(context.Background(), 2) {
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, op.ID)
	}
	if fmt.Sprint(ids) != "[c b a]" {
		t.Errorf("listed %v", ids)
	}
	want := []proto.Message{
		&pb.ListBulkOperationsRequest{PageSize: 2},
		&pb.ListBulkOperationsRequest{PageSize: 2, PageToken: "page-1"},
	}
	got := f.recorded()
	if len(got) != 2 || !proto.Equal(got[0], want[0]) || !proto.Equal(got[1], want[1]) {
		t.Errorf("requests %v", got)
	}
	// Stopping early fetches no further page.
	f.mu.Lock()
	f.requests = nil
	f.mu.Unlock()
	for range client.ListBulkOperations(context.Background(), 2) {
		break
	}
	if n := len(f.recorded()); n != 1 {
		t.Errorf("an iteration stopped on the first page made %d calls", n)
	}
}

// A refused bulk call comes back as an *Error with the status's code and
// its field violations.
func TestBulkErrorsDecodeTheirStatus(t *testing.T) {
	f, client := startFakeBulk(t)
	ctx := context.Background()
	st, _ := status.New(codes.InvalidArgument, "bad filter").WithDetails(&errdetails.BadRequest{
		FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "filter.workflow_version", Description: "needs filter.workflow_name"}},
	})
	f.err = st.Err()
	_, err := client.BulkCancelRuns(ctx, RunFilter{WorkflowVersion: 1}, "")
	var ce *Error
	if !errors.As(err, &ce) || !IsInvalidArgument(err) || len(ce.FieldViolations) != 1 ||
		ce.FieldViolations[0].Field != "filter.workflow_version" {
		t.Errorf("invalid filter: %v", err)
	}
	f.err = status.Error(codes.FailedPrecondition, "an empty filter needs all")
	if _, err := client.BulkRetryRuns(ctx, RunFilter{}); !IsFailedPrecondition(err) {
		t.Errorf("empty filter: %v", err)
	}
	f.err = status.Error(codes.NotFound, "no such operation")
	if _, err := client.GetBulkOperation(ctx, "op-x"); !IsNotFound(err) {
		t.Errorf("get: %v", err)
	}
	if _, err := client.WaitBulkOperation(ctx, "op-x"); !IsNotFound(err) {
		t.Errorf("wait: %v", err)
	}
	f.err = status.Error(codes.FailedPrecondition, "the operation ended")
	if _, err := client.CancelBulkOperation(ctx, "op-1"); !IsFailedPrecondition(err) {
		t.Errorf("cancel: %v", err)
	}
	f.err = status.Error(codes.PermissionDenied, "readers cannot")
	for _, err := range client.ListBulkOperations(ctx, 0) {
		if !IsPermissionDenied(err) {
			t.Errorf("list: %v", err)
		}
	}
}

// WaitBulkOperation polls until the operation ends, and returns it.
func TestWaitBulkOperationPollsUntilTheOperationEnds(t *testing.T) {
	for _, final := range []pb.BulkOperationStatus{
		pb.BulkOperationStatus_BULK_OPERATION_STATUS_SUCCEEDED,
		pb.BulkOperationStatus_BULK_OPERATION_STATUS_CANCELLED,
		pb.BulkOperationStatus_BULK_OPERATION_STATUS_FAILED,
	} {
		f, client := startFakeBulk(t)
		f.statuses = []pb.BulkOperationStatus{
			pb.BulkOperationStatus_BULK_OPERATION_STATUS_PENDING,
			pb.BulkOperationStatus_BULK_OPERATION_STATUS_RUNNING,
			final,
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		op, err := client.WaitBulkOperation(ctx, "op-7")
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if op.ID != "op-7" || pb.BulkOperationStatus(op.Status) != final || !op.Status.IsFinal() {
			t.Errorf("waited for %+v", op)
		}
		if n := len(f.recorded()); n != 3 {
			t.Errorf("%d polls, want 3", n)
		}
	}
}

// A poll that meets UNAVAILABLE is tried again.
func TestWaitBulkOperationRetriesAnUnavailablePoll(t *testing.T) {
	f, client := startFakeBulk(t)
	f.err = status.Error(codes.Unavailable, "restarting")
	f.statuses = []pb.BulkOperationStatus{pb.BulkOperationStatus_BULK_OPERATION_STATUS_SUCCEEDED}
	go func() {
		time.Sleep(300 * time.Millisecond)
		f.mu.Lock()
		f.err = nil
		f.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	op, err := client.WaitBulkOperation(ctx, "op-1")
	if err != nil || op.Status != BulkSucceeded {
		t.Fatalf("waited: %+v, %v", op, err)
	}
	if n := len(f.recorded()); n < 2 {
		t.Errorf("%d polls: the unavailable one was not tried again", n)
	}
}

// An operation that does not end within ctx's deadline gives the
// context's timeout error, after polling more than once.
func TestWaitBulkOperationTimesOut(t *testing.T) {
	f, client := startFakeBulk(t)
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	op, err := client.WaitBulkOperation(ctx, "op-1")
	if op != nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want a deadline error, got %+v, %v", op, err)
	}
	if n := len(f.recorded()); n < 2 {
		t.Errorf("only %d polls in 600 ms", n)
	}
}

// The polls start soon and their spacing grows to a cap.
func TestBulkPollBackoffGrowsToItsCap(t *testing.T) {
	if first := bulkPollBackoff.Cap(1); first > 200*time.Millisecond {
		t.Errorf("the first poll waits up to %s", first)
	}
	prev := time.Duration(0)
	for n := 1; n <= 20; n++ {
		c := bulkPollBackoff.Cap(n)
		if c < prev || c > 2*time.Second {
			t.Errorf("cap %d = %s after %s", n, c, prev)
		}
		prev = c
	}
	if prev != 2*time.Second {
		t.Errorf("the cap ends at %s", prev)
	}
}

func TestBulkStatusNames(t *testing.T) {
	for st, want := range map[BulkOperationStatus]string{
		BulkPending: "PENDING", BulkRunning: "RUNNING", BulkSucceeded: "SUCCEEDED",
		BulkCancelled: "CANCELLED", BulkFailed: "FAILED",
	} {
		if st.String() != want {
			t.Errorf("%d is %s, want %s", st, st, want)
		}
		if st.IsFinal() != (st != BulkPending && st != BulkRunning) {
			t.Errorf("%s.IsFinal() = %v", st, st.IsFinal())
		}
	}
	if BulkKindResume.String() != "RESUME" {
		t.Errorf("kind %s", BulkKindResume)
	}
}
