package checkserver

import (
	"encoding/json"
	"math"
	"reflect"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// sameAsProtojson fails unless appendResponseJSON encodes r to JSON with the
// same content as protojson (protojson's spacing varies on purpose, so the
// two are compared parsed) that protojson decodes back to r.
func sameAsProtojson(t *testing.T, r *rlsv3.RateLimitResponse) {
	t.Helper()
	got, ok := appendResponseJSON(nil, r)
	if !ok {
		t.Fatalf("appendResponseJSON refused %v", r)
	}
	want, err := protojson.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("invalid JSON %s: %v", got, err)
	}
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("appendResponseJSON:\n%s\nprotojson:\n%s", got, want)
	}
	back := new(rlsv3.RateLimitResponse)
	if err := protojson.Unmarshal(got, back); err != nil || !proto.Equal(back, r) {
		t.Fatalf("%s decodes to %v (%v), want %v", got, back, err, r)
	}
}

func TestResponseJSON(t *testing.T) {
	t.Parallel()
	d := func(v time.Duration) *durationpb.Duration { return durationpb.New(v) }
	for _, r := range []*rlsv3.RateLimitResponse{
		{},
		{OverallCode: rlsv3.RateLimitResponse_OK},
		{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{}}},
		{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: rlsv3.RateLimitResponse_OK},
			{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: math.MaxUint32},
			{
				Code:               rlsv3.RateLimitResponse_OVER_LIMIT,
				CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{Name: "per \"user\"\n\\ é\x01", RequestsPerUnit: 100, Unit: rlsv3.RateLimitResponse_RateLimit_WEEK},
				DurationUntilReset: d(0),
			},
		}},
		{Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{}, DurationUntilReset: d(1500 * time.Millisecond)},
			{CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Unit: rlsv3.RateLimitResponse_RateLimit_SECOND}, DurationUntilReset: d(time.Microsecond)},
			{DurationUntilReset: d(time.Nanosecond)},
			{DurationUntilReset: d(59*time.Second + 10*time.Millisecond)},
			{DurationUntilReset: d(123456789 * time.Nanosecond), LimitRemaining: 7},
			{DurationUntilReset: &durationpb.Duration{Seconds: 315576000000}},
		}},
	} {
		sameAsProtojson(t, r)
	}
}

func TestResponseJSONFallsBack(t *testing.T) {
	t.Parallel()
	for name, r := range map[string]*rlsv3.RateLimitResponse{
		"headers":      {ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "a", Value: "b"}}},
		"unknown code": {OverallCode: 42},
		"unknown unit": {Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Unit: 42}}}},
		"bad utf-8":    {Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "\xff"}}}},
		"multiplier":   {Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{UnitMultiplier: wrapperspb.UInt32(2)}}}},
		"negative":     {Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{DurationUntilReset: durationpb.New(-time.Second)}}},
		"out of range": {Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{DurationUntilReset: &durationpb.Duration{Seconds: 315576000001}}}},
		"nil status":   {Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{nil}},
		"quota":        {Quota: &rlsv3.RateLimitResponse_Quota{}},
		"status quota": {Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Quota: &rlsv3.RateLimitResponse_Quota{}}}},
		"raw body":     {RawBody: []byte("x")},
	} {
		if out, ok := appendResponseJSON(nil, r); ok {
			t.Errorf("%s: encoded as %s, want a fallback to protojson", name, out)
		}
	}
}

func FuzzResponseJSON(f *testing.F) {
	f.Add(int32(1), int32(2), "per-user", uint32(100), int32(1), uint32(99), int64(1), int32(500000000), uint8(2))
	f.Add(int32(0), int32(0), "", uint32(0), int32(0), uint32(0), int64(0), int32(0), uint8(0))
	f.Fuzz(func(t *testing.T, overall, code int32, name string, rpu uint32, unit int32, remaining uint32, secs int64, nanos int32, n uint8) {
		r := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_Code(overall)}
		for i := range int(n % 4) {
			st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_Code(code), LimitRemaining: remaining >> i}
			if i%2 == 0 {
				st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: rpu, Unit: rlsv3.RateLimitResponse_RateLimit_Unit(unit)}
				st.DurationUntilReset = &durationpb.Duration{Seconds: secs, Nanos: nanos}
			}
			r.Statuses = append(r.Statuses, st)
		}
		if _, ok := appendResponseJSON(nil, r); !ok {
			return // protojson's business
		}
		sameAsProtojson(t, r)
	})
}
