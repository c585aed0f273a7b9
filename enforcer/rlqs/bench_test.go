package rlqs_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	rlsv3common "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/enforcer/rlqs"
)

// BenchmarkReportRoundTrip is one usage report of a bucket the stream has
// not seen, through gRPC to its assignment: the bucket resolved, its usage
// counted in Redis, the client joined to its presence set, the assignment
// sent back. BenchmarkCheckBaseline is the same enforcer answering one RLS
// check of the same kind of descriptor: the ratio is what a report costs
// next to a check.
func BenchmarkReportRoundTrip(b *testing.B) {
	e := startEnforcer(b, rlqs.Options{Refresh: time.Hour, MaxBuckets: 1 << 30})
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(e.conn).StreamRateLimitQuotas(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	report := func(i int) {
		if err := stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
			BucketId:           &rlqsv3.BucketId{Bucket: map[string]string{"user": "u" + strconv.Itoa(i)}},
			TimeElapsed:        durationpb.New(time.Second),
			NumRequestsAllowed: 3,
		}}}); err != nil {
			b.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil || len(resp.GetBucketAction()) != 1 {
			b.Fatalf("response %v, %v", resp, err)
		}
	}
	report(-1)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		report(i)
	}
}

func BenchmarkCheckBaseline(b *testing.B) {
	e := startEnforcer(b, rlqs.Options{})
	c := rlsv3.NewRateLimitServiceClient(e.conn)
	check := func(i int) {
		resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 3,
			Descriptors: []*rlsv3common.RateLimitDescriptor{{Entries: []*rlsv3common.RateLimitDescriptor_Entry{{Key: "user", Value: "u" + strconv.Itoa(i)}}}}})
		if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			b.Fatalf("check: %v, %v", resp, err)
		}
	}
	check(-1)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		check(i)
	}
}
