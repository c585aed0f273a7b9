package headers

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/sluicehq/sluice/enforcer/engine"
)

// ProblemContentType is the media type of an RFC 9457 problem document.
const ProblemContentType = "application/problem+json"

// Problem is an RFC 9457 problem details object for a rejected request.
// Type is "about:blank" (the problem is what the status says); Limit and
// RetryAfter are extension members a client may use.
type Problem struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Detail   string `json:"detail,omitempty"`
	Instance string `json:"instance,omitempty"`
	// Limit names the limit that rejected the request, when one did.
	Limit string `json:"limit,omitempty"`
	// RetryAfter repeats the Retry-After header, in seconds.
	RetryAfter int64 `json:"retry_after,omitempty"`
}

// RateLimited returns the problem for res, a rejected decision, answered
// with status (429 when 0) to a request for instance (the request path).
func RateLimited(res engine.Result, status int, instance string) Problem {
	if status == 0 {
		status = http.StatusTooManyRequests
	}
	p := Problem{
		Type:       "about:blank",
		Title:      http.StatusText(status),
		Status:     status,
		Instance:   instance,
		RetryAfter: RetryAfterSeconds(res),
	}
	name, closed := "", false
	if i := res.MostRestrictive(); i >= 0 {
		name = res.Statuses[i].Limit.Name
	} else {
		for _, s := range res.Statuses {
			if s.Code == engine.OverLimit && s.Limit != nil {
				name, closed = s.Limit.Name, s.StoreFailed && !s.Local
				break
			}
		}
	}
	p.Limit = name
	switch {
	case closed:
		p.Detail = fmt.Sprintf("The rate limiter is unavailable and the limit %s fails closed; retry in %d s.", strconv.Quote(name), p.RetryAfter)
	case name != "":
		p.Detail = fmt.Sprintf("Rate limit %s exceeded; retry in %d s.", strconv.Quote(name), p.RetryAfter)
	default:
		p.Detail = fmt.Sprintf("Rate limit exceeded; retry in %d s.", p.RetryAfter)
	}
	return p
}

// WriteProblem writes p as the response: its status, Content-Type
// application/problem+json and Cache-Control no-store. Rate-limit headers
// must be set on w before.
func WriteProblem(w http.ResponseWriter, p Problem) {
	body, err := json.Marshal(p)
	if err != nil {
		// Problem holds only strings and integers: Marshal cannot fail.
		body = []byte(`{"type":"about:blank","status":` + strconv.Itoa(p.Status) + `}`)
	}
	h := w.Header()
	h.Set("Content-Type", ProblemContentType)
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(p.Status)
	w.Write(append(body, '\n'))
}
