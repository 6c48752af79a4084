// Package smoketest checks that the generated wire layer (gen/composer/v1)
// compiles, that its messages round-trip, and that the gRPC clients of every
// service exist. It needs no server.
package smoketest

import (
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	composerv1 "github.com/composer-dev/composer/sdks/go/gen/composer/v1"
)

func TestStartRunRequestRoundTrips(t *testing.T) {
	input, err := structpb.NewValue(map[string]any{
		"order_id": "A-17",
		"amount":   12.5,
		"items":    []any{1, 2},
		"rush":     true,
	})
	if err != nil {
		t.Fatal(err)
	}
	req := &composerv1.StartRunRequest{
		WorkflowName:   "checkout",
		Version:        3,
		Input:          input,
		IdempotencyKey: "order-A-17",
		Labels:         map[string]string{"team": "payments"},
	}

	wire, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var got composerv1.StartRunRequest
	if err := proto.Unmarshal(wire, &got); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(req, &got) {
		t.Fatalf("round trip changed the message:\nwant %v\ngot  %v", req, &got)
	}
	if id := got.GetInput().GetStructValue().GetFields()["order_id"].GetStringValue(); id != "A-17" {
		t.Fatalf("input.order_id = %q, want A-17", id)
	}
}

func TestMessagesReferenceEachOtherAcrossFiles(t *testing.T) {
	resp := &composerv1.PollTasksResponse{Tasks: []*composerv1.Task{{
		TaskId:        "t-1",
		Attempt:       2,
		LeaseToken:    "lease-9",
		LeaseDuration: durationpb.New(30e9),
	}}}
	wire, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	var got composerv1.PollTasksResponse
	if err := proto.Unmarshal(wire, &got); err != nil {
		t.Fatal(err)
	}
	if d := got.GetTasks()[0].GetLeaseDuration().AsDuration().Seconds(); d != 30 {
		t.Fatalf("lease_duration = %vs, want 30s", d)
	}
}

func TestServicesAndClients(t *testing.T) {
	// grpc.NewClient connects lazily: no server is contacted.
	conn, err := grpc.NewClient("passthrough:///127.0.0.1:1",
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	clients := map[string]any{
		"composer.v1.RunService":      composerv1.NewRunServiceClient(conn),
		"composer.v1.ServerService":   composerv1.NewServerServiceClient(conn),
		"composer.v1.WorkerService":   composerv1.NewWorkerServiceClient(conn),
		"composer.v1.WorkflowService": composerv1.NewWorkflowServiceClient(conn),
	}
	descs := []grpc.ServiceDesc{
		composerv1.RunService_ServiceDesc,
		composerv1.ServerService_ServiceDesc,
		composerv1.WorkerService_ServiceDesc,
		composerv1.WorkflowService_ServiceDesc,
	}
	for _, sd := range descs {
		if clients[sd.ServiceName] == nil {
			t.Errorf("no client for %s", sd.ServiceName)
		}
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(sd.ServiceName))
		if err != nil {
			t.Fatalf("%s is not registered: %v", sd.ServiceName, err)
		}
		methods := d.(protoreflect.ServiceDescriptor).Methods()
		if got := len(sd.Methods) + len(sd.Streams); got != methods.Len() || got == 0 {
			t.Errorf("%s: ServiceDesc has %d methods, descriptor %d", sd.ServiceName, got, methods.Len())
		}
	}
}
