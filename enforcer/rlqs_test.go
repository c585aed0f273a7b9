package enforcer_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/enforcer"
	"github.com/sluicehq/sluice/enforcer/node"
	"github.com/sluicehq/sluice/internal/testenv"
)

// The node's gRPC port serves the Rate Limit Quota Service, and shutting
// the node down ends its streams at once (with Unavailable) instead of
// waiting for them.
func TestRunServesRLQS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "api.yaml"), []byte(apiYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	r := start(t, enforcer.Config{
		Config:   node.Config{RulesDir: dir, NodeID: "rlqs-node", RedisURL: testenv.RedisURL(t), KeyPrefix: testenv.KeyPrefix(t)},
		HTTPAddr: "127.0.0.1:0",
		GRPCAddr: "127.0.0.1:0",
	})
	conn, err := grpc.NewClient(r.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	id := &rlqsv3.BucketId{Bucket: map[string]string{"api_key": "k1"}}
	if err := stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "api", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		{BucketId: id, TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: 1}}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	// The Lyft file counts in fixed windows: 2 per minute, 1 left.
	tb := resp.GetBucketAction()[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	if tb.GetMaxTokens() != 1 || tb.GetTokensPerFill().GetValue() != 2 || tb.GetFillInterval().AsDuration() != time.Minute {
		t.Fatalf("assignment %v, want a token bucket of 1 token, 2 per minute", resp)
	}
	stopped := time.Now()
	go r.stop(t)
	if _, err := stream.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("stream after shutdown: %v, want Unavailable", err)
	}
	if d := time.Since(stopped); d > 5*time.Second {
		t.Fatalf("stream ended %v after shutdown began", d)
	}
}
