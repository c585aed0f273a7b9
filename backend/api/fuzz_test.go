package api

import (
	"bytes"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/gin-gonic/gin"
)

// fuzzBody has every shape of field a request body holds.
type fuzzBody struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels"`
	List   []string          `json:"list"`
	Nested *struct {
		In string `json:"in"`
	} `json:"nested"`
	N       int64 `json:"n"`
	Enabled *bool `json:"enabled"`
}

// FuzzDecodeBody: decodeLimit, which reads every JSON body of the API,
// never panics, answers every refusal with a 4xx, and what it accepts holds
// no NUL byte or invalid UTF-8 in any string.
func FuzzDecodeBody(f *testing.F) {
	for _, s := range []string{
		`{"name":"a","labels":{"k":"v"},"list":["x"],"nested":{"in":"y"},"n":1,"enabled":true}`,
		`{"name":"a\u0000"}`, "{\"labels\":{\"k\":\"\xff\"}}", `{"nested":{"in":"\ud800"}}`, `{"unknown":1}`,
		`{"name":"a"} {"name":"b"}`, ``, `[`, "{\"list\":[\"\xe2\x82\"]}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		c, _ := gin.CreateTestContext(httptest.NewRecorder())
		c.Request = httptest.NewRequest("POST", "/", bytes.NewReader(body))
		var v fuzzBody
		err := decodeLimit(c, &v, maxLoginBytes, true)
		if err != nil {
			ae, ok := err.(*apiError)
			if !ok || ae.status < 400 || ae.status > 499 {
				t.Fatalf("refusal %v is not a 4xx", err)
			}
			return
		}
		for _, s := range append([]string{v.Name}, v.List...) {
			if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
				t.Fatalf("accepted %q", s)
			}
		}
		for k, s := range v.Labels {
			if !utf8.ValidString(k+s) || strings.IndexByte(k+s, 0) >= 0 {
				t.Fatalf("accepted label %q=%q", k, s)
			}
		}
		fieldAt(body, len(body)/2) // never panics on any input
	})
}
