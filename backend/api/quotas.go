package api

import (
	"encoding/csv"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules"
)

// Bounds of the quota queries.
const (
	maxQuotaLimit   = 1000
	maxQuotaOffset  = 100_000
	maxQuotaCSVRows = 1_000_000
	quotaCSVPage    = 1000
)

// parsePeriod reads a quota period: "2026" (the year), "2026-12" (the
// month), "2026-12-01" (the day) or "2026-W49" (the ISO week, from
// Monday), all UTC. It returns the unit and the period's start.
func parsePeriod(s string) (rules.Unit, time.Time, error) {
	bad := func(why string) error {
		return badRequest("query parameter period %q is not a period: %s (use 2026, 2026-12, 2026-12-01 or 2026-W49)", cutQuery(s), why)
	}
	digits := func(t string) bool {
		for _, r := range t {
			if r < '0' || r > '9' {
				return false
			}
		}
		return t != ""
	}
	if len(s) < 4 || !digits(s[:4]) {
		return "", time.Time{}, bad("it must start with a four-digit year")
	}
	y, _ := strconv.Atoi(s[:4])
	if y < 1970 {
		return "", time.Time{}, bad("the year must be 1970 or later")
	}
	switch {
	case len(s) == 4:
		return rules.Year, time.Date(y, 1, 1, 0, 0, 0, 0, time.UTC), nil
	case len(s) == 8 && s[4:6] == "-W" && digits(s[6:]):
		w, _ := strconv.Atoi(s[6:])
		jan4 := time.Date(y, 1, 4, 0, 0, 0, 0, time.UTC)
		start := jan4.AddDate(0, 0, -(int(jan4.Weekday())+6)%7+7*(w-1))
		if iy, iw := start.ISOWeek(); w < 1 || iy != y || iw != w {
			return "", time.Time{}, bad(fmt.Sprintf("%d has no ISO week %d", y, w))
		}
		return rules.Week, start, nil
	case len(s) == 7 && s[4] == '-' && digits(s[5:]):
		t, err := time.Parse("2006-01", s)
		if err != nil {
			return "", time.Time{}, bad("the month must be 01 to 12")
		}
		return rules.Month, t, nil
	case len(s) == 10 && s[4] == '-' && s[7] == '-' && digits(s[5:7]) && digits(s[8:]):
		t, err := time.Parse("2006-01-02", s)
		if err != nil {
			return "", time.Time{}, bad("no such date")
		}
		return rules.Day, t, nil
	}
	return "", time.Time{}, bad("unknown format")
}

// cutQuery shortens a query value quoted in an error.
func cutQuery(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// quotaFilter reads domain, rule, value, period, limit and offset. value
// needs domain: a viewer of a domain that masks its values cannot look a
// raw value up.
func (a *API) quotaFilter(c *gin.Context) (store.QuotaFilter, error) {
	f := store.QuotaFilter{Domain: c.Query("domain"), Rule: c.Query("rule"), Value: c.Query("value"), Limit: 100}
	if f.Value != "" {
		if f.Domain == "" {
			return f, badRequest("query parameter value needs domain")
		}
		if _, m := a.maskValue(c, f.Domain, f.Value); m {
			return f, badRequest("domain %q masks its values for viewers: a value cannot be looked up", f.Domain)
		}
	}
	if p := c.Query("period"); p != "" {
		var err error
		if f.Unit, f.Start, err = parsePeriod(p); err != nil {
			return f, err
		}
	}
	limit, err := queryInt(c, "limit")
	if err != nil {
		return f, err
	}
	if limit > maxQuotaLimit {
		return f, badRequest("query parameter limit must be at most %d", maxQuotaLimit)
	}
	if limit > 0 {
		f.Limit = int(limit)
	}
	offset, err := queryInt(c, "offset")
	if err != nil {
		return f, err
	}
	if offset > maxQuotaOffset {
		return f, badRequest("query parameter offset must be at most %d", maxQuotaOffset)
	}
	f.Offset = int(offset)
	return f, nil
}

// maskValue returns value as the caller sees it (masked for a viewer when
// domain masks its values) and whether it is masked.
func (a *API) maskValue(c *gin.Context, domain, value string) (string, bool) {
	if a.stats == nil || !masked(c) {
		return value, false
	}
	return a.stats.MaskValue(domain, value)
}

type quotaJSON struct {
	Domain      string `json:"domain"`
	Rule        string `json:"rule"`
	Unit        string `json:"unit"`
	Value       string `json:"value"`
	Masked      bool   `json:"masked,omitempty"`
	PeriodStart string `json:"period_start"`
	PeriodEnd   string `json:"period_end"`
	Used        int64  `json:"used"`
	Limit       int64  `json:"limit"`
}

// listQuotas answers GET /api/v1/quotas: the usage the filter selects,
// most used first, or with format=csv every row of it as a CSV export.
func (a *API) listQuotas(c *gin.Context) error {
	f, err := a.quotaFilter(c)
	if err != nil {
		return err
	}
	switch c.Query("format") {
	case "":
	case "csv":
		return a.exportQuotas(c, f)
	default:
		return badRequest("query parameter format must be csv or absent")
	}
	rows, err := a.store.ListQuotaUsage(c.Request.Context(), f)
	if err != nil {
		return err
	}
	out := make([]quotaJSON, len(rows))
	for i, r := range rows {
		v, m := a.maskValue(c, r.Domain, r.Value)
		out[i] = quotaJSON{Domain: r.Domain, Rule: r.Rule, Unit: string(r.Unit), Value: v, Masked: m,
			PeriodStart: r.PeriodStart.Format(time.RFC3339), PeriodEnd: r.PeriodEnd.Format(time.RFC3339), Used: r.Used, Limit: r.Limit}
	}
	var next *int
	if len(rows) == f.Limit && f.Offset+f.Limit <= maxQuotaOffset {
		n := f.Offset + f.Limit
		next = &n
	}
	c.JSON(http.StatusOK, gin.H{"usage": out, "next_offset": next})
	return nil
}

var quotaColumns = []string{"domain", "rule", "unit", "value", "period_start", "period_end", "used", "limit"}

// exportQuotas streams every row f selects as CSV in key order (domain,
// rule, unit, period, value), a page at a time; an export of more than
// maxQuotaCSVRows rows is refused before anything is sent.
func (a *API) exportQuotas(c *gin.Context, f store.QuotaFilter) error {
	ctx := c.Request.Context()
	rows, cursor, err := a.store.ExportQuotaUsage(ctx, f, nil, quotaCSVPage)
	if err != nil {
		return err
	}
	if cursor != nil {
		// More than a page: refuse an export over the bound before the
		// status line goes out.
		n, err := a.store.CountQuotaUsage(ctx, f, maxQuotaCSVRows+1)
		if err != nil {
			return err
		}
		if n > maxQuotaCSVRows {
			return badRequest("the export is over %d rows: narrow it by domain, rule or period", maxQuotaCSVRows)
		}
	}
	name := "sluice-quotas.csv"
	if p := c.Query("period"); p != "" {
		name = "sluice-quotas-" + p + ".csv"
	}
	c.Header("Content-Type", "text/csv; charset=utf-8")
	c.Header("Content-Disposition", `attachment; filename="`+name+`"`)
	c.Status(http.StatusOK)
	w := csv.NewWriter(c.Writer)
	w.Write(quotaColumns)
	for {
		for _, r := range rows {
			v, _ := a.maskValue(c, r.Domain, r.Value)
			w.Write([]string{cell(r.Domain), cell(r.Rule), string(r.Unit), cell(v),
				r.PeriodStart.Format(time.RFC3339), r.PeriodEnd.Format(time.RFC3339),
				strconv.FormatInt(r.Used, 10), strconv.FormatInt(r.Limit, 10)})
		}
		w.Flush()
		if w.Error() != nil || cursor == nil {
			return nil
		}
		if rows, cursor, err = a.store.ExportQuotaUsage(ctx, f, cursor, quotaCSVPage); err != nil {
			// The status line is out; the client sees a truncated file.
			a.log.ErrorContext(c, "export quotas", "request_id", c.GetString("request_id"), "error", err)
			return nil
		}
	}
}
