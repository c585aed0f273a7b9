package checkserver

import (
	"fmt"
	"math"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/headers"
	"github.com/sluicehq/sluice/rules"
)

// toRequest turns an RLS request into an engine request. Per-descriptor
// hits_addend overrides the request's; a descriptor's limit override
// ("limit", with unit_multiplier) replaces the configured limit as in
// envoyproxy/ratelimit; is_negative_hits (refunds) is rejected rather than
// silently consuming.
func toRequest(m *rlsv3.RateLimitRequest) (engine.Request, error) {
	descs := m.GetDescriptors()
	req := engine.Request{
		Domain: m.GetDomain(),
		Hits:   uint64(m.GetHitsAddend()),
	}
	// One backing array for every descriptor's entries, and for a request
	// of one descriptor of a few entries (most are) one allocation for
	// the descriptor and its entries.
	n := 0
	for _, d := range descs {
		n += len(d.GetEntries())
	}
	var all []rules.Entry
	if len(descs) == 1 && n <= len(oneDescriptor{}.entries) {
		one := new(oneDescriptor)
		req.Descriptors, all = one.desc[:], one.entries[:n]
	} else {
		req.Descriptors, all = make([]engine.Descriptor, len(descs)), make([]rules.Entry, n)
	}
	for i, d := range descs {
		if d.GetIsNegativeHits() {
			return engine.Request{}, fmt.Errorf("%w: descriptors[%d]: is_negative_hits is not supported", engine.ErrInvalidRequest, i)
		}
		es := d.GetEntries()
		entries := all[:len(es):len(es)]
		all = all[len(es):]
		for j, e := range es {
			entries[j] = rules.Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		req.Descriptors[i].Entries = entries
		if h := d.GetHitsAddend(); h != nil {
			v := h.GetValue()
			req.Descriptors[i].Hits = &v
		}
		if o := d.GetLimit(); o != nil {
			unit := fromUnit(o.GetUnit())
			if unit == "" {
				return engine.Request{}, fmt.Errorf("%w: descriptors[%d].limit: unit %v is not supported", engine.ErrInvalidRequest, i, o.GetUnit())
			}
			req.Descriptors[i].Override = &engine.Override{
				RequestsPerUnit: o.GetRequestsPerUnit(),
				Unit:            unit,
				Multiplier:      o.GetUnitMultiplier().GetValue(),
			}
		}
	}
	return req, nil
}

// oneDescriptor holds the descriptor of a one-descriptor request and its
// entries, allocated together.
type oneDescriptor struct {
	desc    [1]engine.Descriptor
	entries [3]rules.Entry
}

func fromUnit(u typev3.RateLimitUnit) rules.Unit {
	switch u {
	case typev3.RateLimitUnit_SECOND:
		return rules.Second
	case typev3.RateLimitUnit_MINUTE:
		return rules.Minute
	case typev3.RateLimitUnit_HOUR:
		return rules.Hour
	case typev3.RateLimitUnit_DAY:
		return rules.Day
	case typev3.RateLimitUnit_MONTH:
		return rules.Month
	case typev3.RateLimitUnit_YEAR:
		return rules.Year
	}
	return ""
}

// toHeaders renders the rate-limit headers of res as Envoy header options
// (response_headers_to_add).
func toHeaders(res engine.Result) []*corev3.HeaderValue {
	var buf [6]headers.Field
	fields := headers.Append(buf[:0], res)
	if len(fields) == 0 {
		return nil
	}
	// The pointers and the values in one allocation (up to six headers).
	var (
		out  []*corev3.HeaderValue
		vals []corev3.HeaderValue
	)
	if len(fields) <= len(buf) {
		all := new(struct {
			ptrs [len(buf)]*corev3.HeaderValue
			vals [len(buf)]corev3.HeaderValue
		})
		out, vals = all.ptrs[:len(fields)], all.vals[:len(fields)]
	} else {
		out, vals = make([]*corev3.HeaderValue, len(fields)), make([]corev3.HeaderValue, len(fields))
	}
	for i, f := range fields {
		vals[i].Key, vals[i].Value = f.Name, f.Value
		out[i] = &vals[i]
	}
	return out
}

// toResponse renders an engine result as an RLS response, with Lyft's
// conventions: no current_limit when no limit applies, for an unlimited
// limit no current_limit and limit_remaining = MaxUint32, and a
// current_limit.name only when the rules name the limit (rate_limit.name;
// the path name that stats use by default is not sent).
func toResponse(res engine.Result) *rlsv3.RateLimitResponse {
	// The messages of all statuses come from a few arrays, not one
	// allocation each: this runs for every check. A check of one
	// descriptor (most are) gets all of them in one allocation.
	n := len(res.Statuses)
	var (
		out      *rlsv3.RateLimitResponse
		statuses []rlsv3.RateLimitResponse_DescriptorStatus
		limits   []rlsv3.RateLimitResponse_RateLimit
		resets   []durationpb.Duration
	)
	if n == 1 {
		one := new(oneStatus)
		out, statuses, limits, resets = &one.resp, one.status[:], one.limit[:], one.reset[:]
		out.Statuses = one.ptr[:]
	} else {
		out = &rlsv3.RateLimitResponse{Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
		statuses = make([]rlsv3.RateLimitResponse_DescriptorStatus, n)
		limits = make([]rlsv3.RateLimitResponse_RateLimit, n)
		resets = make([]durationpb.Duration, n)
	}
	out.OverallCode = toCode(res.Code)
	for i, s := range res.Statuses {
		st := &statuses[i]
		st.Code = toCode(s.Code)
		switch {
		case s.Limit == nil:
		case s.Limit.Unlimited:
			st.LimitRemaining = math.MaxUint32
		default:
			l := &limits[i]
			l.RequestsPerUnit, l.Unit = s.Limit.RequestsPerUnit, toUnit(s.Limit.Unit)
			if s.Limit.Named {
				l.Name = s.Limit.Name
			}
			st.CurrentLimit = l
			if s.Limited() { // counted: by Redis, or locally while it is down
				st.LimitRemaining = uint32(min(max(s.Remaining, 0), math.MaxUint32))
				d := &resets[i]
				d.Seconds, d.Nanos = int64(s.ResetAfter/time.Second), int32(s.ResetAfter%time.Second)
				st.DurationUntilReset = d
			}
		}
		out.Statuses[i] = st
	}
	return out
}

// oneStatus holds a one-descriptor response and its parts, allocated
// together.
type oneStatus struct {
	resp   rlsv3.RateLimitResponse
	ptr    [1]*rlsv3.RateLimitResponse_DescriptorStatus
	status [1]rlsv3.RateLimitResponse_DescriptorStatus
	limit  [1]rlsv3.RateLimitResponse_RateLimit
	reset  [1]durationpb.Duration
}

func toCode(c engine.Code) rlsv3.RateLimitResponse_Code {
	switch c {
	case engine.OK:
		return rlsv3.RateLimitResponse_OK
	case engine.OverLimit:
		return rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return rlsv3.RateLimitResponse_UNKNOWN
}

func toUnit(u rules.Unit) rlsv3.RateLimitResponse_RateLimit_Unit {
	switch u {
	case rules.Second:
		return rlsv3.RateLimitResponse_RateLimit_SECOND
	case rules.Minute:
		return rlsv3.RateLimitResponse_RateLimit_MINUTE
	case rules.Hour:
		return rlsv3.RateLimitResponse_RateLimit_HOUR
	case rules.Day:
		return rlsv3.RateLimitResponse_RateLimit_DAY
	case rules.Week:
		return rlsv3.RateLimitResponse_RateLimit_WEEK
	case rules.Month:
		return rlsv3.RateLimitResponse_RateLimit_MONTH
	case rules.Year:
		return rlsv3.RateLimitResponse_RateLimit_YEAR
	}
	return rlsv3.RateLimitResponse_RateLimit_UNKNOWN
}
