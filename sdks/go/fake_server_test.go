package composer

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/composer-dev/composer/sdks/go/gen/composer/v1"
)

// fakeServer is a WorkerService (and ServerService) on a loopback port that
// hands out scripted tasks and records every call, for the worker's unit
// tests. Its port also serves blobs, a BlobService, and runs, a RunService
// (blob_test.go).
type fakeServer struct {
	pb.UnimplementedWorkerServiceServer
	pb.UnimplementedServerServiceServer

	mu          sync.Mutex
	changed     chan struct{}
	pending     []*pb.Task
	outstanding map[string]bool // task ids leased and not reported
	protocol    string
	pollErrors  int
	polls       []pollRecord
	heartbeats  []beatRecord
	completes   []*pb.CompleteTaskRequest
	fails       []*pb.FailTaskRequest
	// completeErrs are returned, in order, by the next CompleteTask calls.
	completeErrs []error
	// onHeartbeat, when set, answers heartbeats.
	onHeartbeat func(*pb.HeartbeatRequest) (*pb.HeartbeatResponse, error)
	// onReport, when set, sees each CompleteTask and FailTask with its metadata.
	onReport func(method, taskID string, md metadata.MD)
	// receipt, when set, is the first lease of the tasks of a poll that
	// asks to confirm receipt (the server's --lease-receipt-timeout).
	receipt time.Duration
	// offload is the payload_offload_bytes GetServerInfo answers; infos
	// counts the GetServerInfo calls.
	offload int64
	infos   int
	// blobURLs is the blob_urls GetServerInfo answers.
	blobURLs bool
	blobs    *fakeBlobs
	runs     *fakeBlobRuns
}

type pollRecord struct {
	at             time.Time
	maxTasks       int
	outstanding    int
	confirmReceipt bool
}

type beatRecord struct {
	at  time.Time
	req *pb.HeartbeatRequest
}

func startFake(t *testing.T) (*fakeServer, *Client) {
	t.Helper()
	f := &fakeServer{changed: make(chan struct{}), outstanding: map[string]bool{}, protocol: "1.0", blobs: newFakeBlobs(), runs: &fakeBlobRuns{}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pb.RegisterWorkerServiceServer(srv, f)
	pb.RegisterServerServiceServer(srv, f)
	pb.RegisterBlobServiceServer(srv, f.blobs)
	pb.RegisterRunServiceServer(srv, f.runs)
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

func (f *fakeServer) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fakeServer) add(tasks ...*pb.Task) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pending = append(f.pending, tasks...)
	f.notifyLocked()
}

func (f *fakeServer) GetServerInfo(context.Context, *pb.GetServerInfoRequest) (*pb.GetServerInfoResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.infos++
	return &pb.GetServerInfoResponse{ServerVersion: "fake", ProtocolVersion: f.protocol, PayloadOffloadBytes: f.offload, BlobUrls: f.blobURLs}, nil
}

func (f *fakeServer) PollTasks(ctx context.Context, req *pb.PollTasksRequest) (*pb.PollTasksResponse, error) {
	f.mu.Lock()
	f.polls = append(f.polls, pollRecord{
		at: time.Now(), maxTasks: int(req.GetMaxTasks()), outstanding: len(f.outstanding), confirmReceipt: req.GetConfirmReceipt(),
	})
	if f.pollErrors > 0 {
		f.pollErrors--
		f.mu.Unlock()
		return nil, status.Error(codes.Unavailable, "fake outage")
	}
	f.mu.Unlock()
	wait := time.NewTimer(req.GetWait().AsDuration())
	defer wait.Stop()
	for {
		f.mu.Lock()
		if len(f.pending) > 0 {
			n := min(int(req.GetMaxTasks()), len(f.pending))
			out := f.pending[:n]
			f.pending = f.pending[n:]
			for _, task := range out {
				f.outstanding[task.GetTaskId()] = true
				if f.receipt > 0 && req.GetConfirmReceipt() {
					task.LeaseExpireTime = timestamppb.New(time.Now().Add(f.receipt))
				}
			}
			f.mu.Unlock()
			return &pb.PollTasksResponse{Tasks: out}, nil
		}
		changed := f.changed
		f.mu.Unlock()
		select {
		case <-changed:
		case <-wait.C:
			return &pb.PollTasksResponse{}, nil
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
}

func (f *fakeServer) Heartbeat(_ context.Context, req *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
	f.mu.Lock()
	f.heartbeats = append(f.heartbeats, beatRecord{time.Now(), req})
	hook := f.onHeartbeat
	f.mu.Unlock()
	if hook != nil {
		return hook(req)
	}
	return &pb.HeartbeatResponse{LeaseExpireTime: timestamppb.New(time.Now().Add(time.Second))}, nil
}

func (f *fakeServer) CompleteTask(ctx context.Context, req *pb.CompleteTaskRequest) (*pb.CompleteTaskResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	defer f.notifyLocked()
	f.seeReport(ctx, "CompleteTask", req.GetTaskId())
	f.completes = append(f.completes, req)
	if len(f.completeErrs) > 0 {
		err := f.completeErrs[0]
		f.completeErrs = f.completeErrs[1:]
		if err != nil {
			return nil, err
		}
	}
	delete(f.outstanding, req.GetTaskId())
	return &pb.CompleteTaskResponse{}, nil
}

func (f *fakeServer) FailTask(ctx context.Context, req *pb.FailTaskRequest) (*pb.FailTaskResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	defer f.notifyLocked()
	f.seeReport(ctx, "FailTask", req.GetTaskId())
	f.fails = append(f.fails, req)
	delete(f.outstanding, req.GetTaskId())
	return &pb.FailTaskResponse{}, nil
}

func (f *fakeServer) seeReport(ctx context.Context, method, taskID string) {
	if f.onReport != nil {
		md, _ := metadata.FromIncomingContext(ctx)
		f.onReport(method, taskID, md)
	}
}

// snapshot copies the records under the lock.
func (f *fakeServer) snapshot() (polls []pollRecord, beats []beatRecord, completes []*pb.CompleteTaskRequest, fails []*pb.FailTaskRequest) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]pollRecord(nil), f.polls...), append([]beatRecord(nil), f.heartbeats...),
		append([]*pb.CompleteTaskRequest(nil), f.completes...), append([]*pb.FailTaskRequest(nil), f.fails...)
}

func leaseLostStatus() error {
	st, _ := status.New(codes.FailedPrecondition, "the lease is no longer yours").WithDetails(&errdetails.ErrorInfo{Reason: ReasonLeaseLost, Domain: "composer.dev"})
	return st.Err()
}

func fakeTask(id, queue, name string, lease time.Duration, input any) *pb.Task {
	v, _ := structpb.NewValue(input)
	return &pb.Task{
		TaskId: id, Attempt: 1, LeaseToken: "token-" + id, LeaseExpireTime: timestamppb.New(time.Now().Add(lease)),
		LeaseDuration: durationpb.New(lease), RunId: "run-" + id, NodeId: "node-" + id, WorkflowName: "wf",
		WorkflowVersion: 1, Queue: queue, TaskName: name, Input: v, Namespace: "default",
	}
}

// runWorker runs w until the test ends (or stop is called); it returns stop,
// which cancels Run and waits for it.
func runWorker(t *testing.T, w *Worker) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	var result error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case result = <-done:
			case <-time.After(30 * time.Second):
				t.Error("the worker did not stop within 30 s")
			}
		})
		return result
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// eventually waits until cond holds.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s not reached within %s", what, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var fastBackoff = Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond, Multiplier: 2, Jitter: 0.5}
