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

// fakeQueues is a QueueService (and a RunService answering GetRun and
// ListRuns) on a loopback port that answers from a script and records every
// request.
type fakeQueues struct {
	pb.UnimplementedQueueServiceServer
	pb.UnimplementedRunServiceServer

	mu       sync.Mutex
	requests []proto.Message
	// err, when set, answers every call.
	err error
	// pages are ListQueueRateLimits' pages: page i's token is "page-i".
	pages [][]*pb.QueueRateLimit
	// run is what GetRun and ListRuns answer.
	run *pb.Run
}

func startFakeQueues(t *testing.T) (*fakeQueues, *Client) {
	t.Helper()
	f := &fakeQueues{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pb.RegisterQueueServiceServer(srv, f)
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

func (f *fakeQueues) record(req proto.Message) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, req)
	return f.err
}

func (f *fakeQueues) recorded() []proto.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]proto.Message(nil), f.requests...)
}

var (
	fakeCreated = time.Unix(1_700_000_000, 0).UTC()
	fakeUpdated = time.Unix(1_700_000_060, 0).UTC()
)

// stored is the limit as the server would store it: defaults filled in, times set.
func stored(l *pb.QueueRateLimit) *pb.QueueRateLimit {
	out := proto.Clone(l).(*pb.QueueRateLimit)
	if out.Burst == 0 {
		out.Burst = 9
	}
	out.CreateTime, out.UpdateTime = timestamppb.New(fakeCreated), timestamppb.New(fakeUpdated)
	return out
}

func (f *fakeQueues) SetQueueRateLimit(_ context.Context, req *pb.SetQueueRateLimitRequest) (*pb.SetQueueRateLimitResponse, error) {
	if err := f.record(req); err != nil {
		return nil, err
	}
	return &pb.SetQueueRateLimitResponse{Limit: stored(req.GetLimit())}, nil
}

func (f *fakeQueues) GetQueueRateLimit(_ context.Context, req *pb.GetQueueRateLimitRequest) (*pb.GetQueueRateLimitResponse, error) {
	if err := f.record(req); err != nil {
		return nil, err
	}
	return &pb.GetQueueRateLimitResponse{Limit: stored(&pb.QueueRateLimit{
		Queue: req.GetQueue(), PerSecond: 0.5, Burst: 1, PerKeyPerSecond: 3, PerKeyBurst: 4,
	})}, nil
}

func (f *fakeQueues) ListQueueRateLimits(_ context.Context, req *pb.ListQueueRateLimitsRequest) (*pb.ListQueueRateLimitsResponse, error) {
	if err := f.record(req); err != nil {
		return nil, err
	}
	page := 0
	if req.GetPageToken() != "" {
		if _, err := fmt.Sscanf(req.GetPageToken(), "page-%d", &page); err != nil {
			return nil, status.Error(codes.InvalidArgument, "bad page token")
		}
	}
	resp := &pb.ListQueueRateLimitsResponse{Limits: f.pages[page]}
	if page+1 < len(f.pages) {
		resp.NextPageToken = fmt.Sprintf("page-%d", page+1)
	}
	return resp, nil
}

func (f *fakeQueues) DeleteQueueRateLimit(_ context.Context, req *pb.DeleteQueueRateLimitRequest) (*pb.DeleteQueueRateLimitResponse, error) {
	if err := f.record(req); err != nil {
		return nil, err
	}
	return &pb.DeleteQueueRateLimitResponse{}, nil
}

func (f *fakeQueues) GetRun(_ context.Context, req *pb.GetRunRequest) (*pb.GetRunResponse, error) {
	if err := f.record(req); err != nil {
		return nil, err
	}
	return &pb.GetRunResponse{Run: f.run}, nil
}

func (f *fakeQueues) ListRuns(_ context.Context, req *pb.ListRunsRequest) (*pb.ListRunsResponse, error) {
	if err := f.record(req); err != nil {
		return nil, err
	}
	return &pb.ListRunsResponse{Runs: []*pb.Run{f.run}}, nil
}

// Each queue call sends its fields as the RPC has them and reads the limit
// back with every field, times included.
func TestQueueRateLimitCallsMapTheirRequestsAndAnswers(t *testing.T) {
	f, client := startFakeQueues(t)
	ctx := context.Background()

	set, err := client.SetQueueRateLimit(ctx, QueueRateLimit{
		Queue: "emails", PerSecond: 2.5, PerKeyPerSecond: 1.5, PerKeyBurst: 2,
		CreateTime: time.Now(), UpdateTime: time.Now(),
	})
	if err != nil {
		t.Fatal(err)
	}
	want := QueueRateLimit{
		Queue: "emails", PerSecond: 2.5, Burst: 9, PerKeyPerSecond: 1.5, PerKeyBurst: 2,
		CreateTime: fakeCreated, UpdateTime: fakeUpdated,
	}
	if *set != want {
		t.Errorf("set answered %+v, want %+v", *set, want)
	}
	got, err := client.GetQueueRateLimit(ctx, "crm")
	if err != nil {
		t.Fatal(err)
	}
	want = QueueRateLimit{
		Queue: "crm", PerSecond: 0.5, Burst: 1, PerKeyPerSecond: 3, PerKeyBurst: 4,
		CreateTime: fakeCreated, UpdateTime: fakeUpdated,
	}
	if *got != want {
		t.Errorf("get answered %+v, want %+v", *got, want)
	}
	if err := client.DeleteQueueRateLimit(ctx, "crm"); err != nil {
		t.Fatal(err)
	}

	wantRequests := []proto.Message{
		// The times are the server's: never sent.
		&pb.SetQueueRateLimitRequest{Limit: &pb.QueueRateLimit{
			Queue: "emails", PerSecond: 2.5, PerKeyPerSecond: 1.5, PerKeyBurst: 2,
		}},
		&pb.GetQueueRateLimitRequest{Queue: "crm"},
		&pb.DeleteQueueRateLimitRequest{Queue: "crm"},
	}
	requests := f.recorded()
	if len(requests) != len(wantRequests) {
		t.Fatalf("%d requests, want %d", len(requests), len(wantRequests))
	}
	for i := range wantRequests {
		if !proto.Equal(requests[i], wantRequests[i]) {
			t.Errorf("request %d: %v, want %v", i, requests[i], wantRequests[i])
		}
	}
}

// ListQueueRateLimits pages with the page size and the tokens given, and
// stops fetching when the iteration stops.
func TestListQueueRateLimitsPagesThroughEveryLimit(t *testing.T) {
	f, client := startFakeQueues(t)
	f.pages = [][]*pb.QueueRateLimit{
		{{Queue: "a", PerSecond: 1, Burst: 1}, {Queue: "b", PerSecond: 2, Burst: 2}},
		{{Queue: "c", PerKeyPerSecond: 3, PerKeyBurst: 3}},
	}
	var queues []string
	for l, err := range client.ListQueueRateLimits(context.Background(), 2) {
		if err != nil {
			t.Fatal(err)
		}
		queues = append(queues, fmt.Sprintf("%s:%g/%d:%g/%d", l.Queue, l.PerSecond, l.Burst, l.PerKeyPerSecond, l.PerKeyBurst))
	}
	if fmt.Sprint(queues) != "[a:1/1:0/0 b:2/2:0/0 c:0/0:3/3]" {
		t.Errorf("listed %v", queues)
	}
	want := []proto.Message{
		&pb.ListQueueRateLimitsRequest{PageSize: 2},
		&pb.ListQueueRateLimitsRequest{PageSize: 2, PageToken: "page-1"},
	}
	got := f.recorded()
	if len(got) != 2 || !proto.Equal(got[0], want[0]) || !proto.Equal(got[1], want[1]) {
		t.Errorf("requests %v", got)
	}
	f.mu.Lock()
	f.requests = nil
	f.mu.Unlock()
	for range client.ListQueueRateLimits(context.Background(), 2) {
		break
	}
	if n := len(f.recorded()); n != 1 {
		t.Errorf("an iteration stopped on the first page made %d calls", n)
	}
}

// A refused queue call comes back as an *Error with the status's code and
// its field violations.
func TestQueueRateLimitErrorsDecodeTheirStatus(t *testing.T) {
	f, client := startFakeQueues(t)
	ctx := context.Background()
	st, _ := status.New(codes.InvalidArgument, "bad limit").WithDetails(&errdetails.BadRequest{
		FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "limit.burst", Description: "under the rate"}},
	})
	f.err = st.Err()
	_, err := client.SetQueueRateLimit(ctx, QueueRateLimit{Queue: "q", PerSecond: 5, Burst: 2})
	var ce *Error
	if !errors.As(err, &ce) || !IsInvalidArgument(err) || len(ce.FieldViolations) != 1 ||
		ce.FieldViolations[0].Field != "limit.burst" {
		t.Errorf("invalid limit: %v", err)
	}
	f.err = status.Error(codes.NotFound, "no limit")
	if l, err := client.GetQueueRateLimit(ctx, "q"); l != nil || !IsNotFound(err) {
		t.Errorf("get: %+v, %v", l, err)
	}
	if err := client.DeleteQueueRateLimit(ctx, "q"); !IsNotFound(err) {
		t.Errorf("delete: %v", err)
	}
	f.err = status.Error(codes.PermissionDenied, "readers cannot")
	for _, err := range client.ListQueueRateLimits(ctx, 0) {
		if !IsPermissionDenied(err) {
			t.Errorf("list: %v", err)
		}
	}
}

// A QUEUED run reads as RunQueued with its concurrency key; a run of a
// workflow without concurrency has an empty key.
func TestRunReadsQueuedAndItsConcurrencyKey(t *testing.T) {
	f, client := startFakeQueues(t)
	ctx := context.Background()
	f.run = &pb.Run{RunId: "r-1", Status: pb.RunStatus_RUN_STATUS_QUEUED, ConcurrencyKey: "customer-7"}
	run, err := client.GetRun(ctx, "r-1")
	if err != nil {
		t.Fatal(err)
	}
	if run.Status != RunQueued || run.Status.String() != "QUEUED" || run.Status.IsFinal() || run.ConcurrencyKey != "customer-7" {
		t.Errorf("read %s with key %q", run.Status, run.ConcurrencyKey)
	}
	for listed, err := range client.ListRuns(ctx, RunFilter{Statuses: []RunStatus{RunQueued}}) {
		if err != nil {
			t.Fatal(err)
		}
		if listed.Status != RunQueued || listed.ConcurrencyKey != "customer-7" {
			t.Errorf("listed %s with key %q", listed.Status, listed.ConcurrencyKey)
		}
	}
	requests := f.recorded()
	wantList := &pb.ListRunsRequest{Statuses: []pb.RunStatus{pb.RunStatus_RUN_STATUS_QUEUED}}
	if len(requests) != 2 || !proto.Equal(requests[1], wantList) {
		t.Errorf("requests %v, want ListRuns %v", requests, wantList)
	}

	f.run = &pb.Run{RunId: "r-2", Status: pb.RunStatus_RUN_STATUS_RUNNING}
	if run, err := client.GetRun(ctx, "r-2"); err != nil || run.Status != RunRunning || run.ConcurrencyKey != "" {
		t.Errorf("a run without a key: %+v, %v", run, err)
	}
}
