package ctl

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/consoleapi"
	"github.com/sluicehq/sluice/rules"
)

// Overrides lists overrides, newest first (domain and status filter when
// not empty).
func (c *Client) Overrides(ctx context.Context, domain, status string) ([]consoleapi.Override, error) {
	q := url.Values{}
	if domain != "" {
		q.Set("domain", domain)
	}
	if status != "" {
		q.Set("status", status)
	}
	q.Set("limit", "1000")
	var out struct {
		Overrides []consoleapi.Override `json:"overrides"`
	}
	_, err := c.call(ctx, "GET", "/api/v1/overrides"+encodeQuery(q), nil, &out)
	return out.Overrides, err
}

// CreateOverride asks for a temporary override and returns it and its
// version or, when approval is required, the change request the console
// proposed instead.
func (c *Client) CreateOverride(ctx context.Context, req consoleapi.OverrideRequest) (consoleapi.OverrideCreated, *consoleapi.ChangeRequest, error) {
	return proposable[consoleapi.OverrideCreated](ctx, c, "POST", "/api/v1/overrides", req)
}

// EndOverride ends an active override and returns the version without it.
func (c *Client) EndOverride(ctx context.Context, id int64, message string) (consoleapi.Published, error) {
	var out consoleapi.Published
	_, err := c.call(ctx, "DELETE", "/api/v1/overrides/"+strconv.FormatInt(id, 10), consoleapi.ReviewRequest{Message: &message}, &out)
	return out, err
}

func overridesList(ctx context.Context, e *env, args []string) error {
	var domain, status string
	fs := e.flags("overrides list")
	fs.StringVar(&domain, "domain", "", "only this domain's overrides")
	fs.StringVar(&status, "status", "", "only active, expired or ended ones")
	if _, err := e.parse(fs, args, 0, "overrides list [--domain D] [--status active|expired|ended]"); err != nil {
		return err
	}
	if err := e.connect(); err != nil {
		return e.fail(err, nil)
	}
	ovs, err := e.client.Overrides(ctx, domain, status)
	if err != nil {
		return e.fail(err, nil)
	}
	if e.jsonOut() {
		return e.printJSON(map[string]any{"overrides": ovs})
	}
	rows := make([][]string, len(ovs))
	for i, o := range ovs {
		pairs := make([]string, len(o.Entries))
		for j, en := range o.Entries {
			pairs[j] = en.Key + "=" + en.Value
		}
		rows[i] = []string{strconv.FormatInt(o.ID, 10), o.Domain, cell(strings.Join(pairs, " ")),
			fmt.Sprintf("%d/%s", o.RateLimit.RequestsPerUnit, o.RateLimit.Unit), when(o.ExpiresAt), string(o.Status),
			strconv.FormatInt(o.Version, 10), cell(o.Author), cell(o.Message)}
	}
	return e.table([]string{"ID", "DOMAIN", "ENTRIES", "RATE", "EXPIRES", "STATUS", "VERSION", "AUTHOR", "MESSAGE"}, rows)
}

// parseRate reads a rate like 8/hour.
func parseRate(s string) (consoleapi.OverrideRate, error) {
	n, unit, ok := strings.Cut(s, "/")
	v, err := strconv.ParseUint(n, 10, 32)
	if !ok || err != nil || rules.Unit(unit).Period() == 0 {
		return consoleapi.OverrideRate{}, fmt.Errorf("--rate %q: want requests/unit, like 8/hour (units: second, minute, hour, day, week, month, year)", s)
	}
	return consoleapi.OverrideRate{Unit: consoleapi.OverrideRateUnit(unit), RequestsPerUnit: int64(v)}, nil
}

func overridesCreate(ctx context.Context, e *env, args []string) error {
	var rate, until, message string
	var lasting time.Duration
	var urgent bool
	fs := e.flags("overrides create")
	fs.StringVar(&rate, "rate", "", "the rate, like 8/hour (required)")
	fs.StringVar(&until, "until", "", "when it ends, RFC 3339 (or --for)")
	fs.DurationVar(&lasting, "for", 0, "how long it lasts, like 48h (or --until)")
	fs.StringVar(&message, "m", "", "why: the ticket, the customer (required)")
	fs.BoolVar(&urgent, "urgent", false, "when approval is required: publish at once anyway (audited as break-glass)")
	const synopsis = "overrides create DOMAIN KEY=VALUE... --rate N/UNIT (--until TIME | --for DURATION) -m MSG [--urgent]"
	args, err := e.parse(fs, args, -1, synopsis)
	if err != nil {
		return err
	}
	if len(args) < 2 {
		return e.usageError(fmt.Errorf("a domain and at least one KEY=VALUE are required\nusage: sluice ctl %s", synopsis))
	}
	req := consoleapi.OverrideRequest{Domain: args[0], Message: message}
	if urgent {
		req.Urgent = &urgent
	}
	for _, a := range args[1:] {
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" {
			return e.usageError(fmt.Errorf("%q: want KEY=VALUE\nusage: sluice ctl %s", a, synopsis))
		}
		req.Entries = append(req.Entries, consoleapi.OverrideEntry{Key: k, Value: v})
	}
	if req.RateLimit, err = parseRate(rate); err != nil {
		return e.usageError(err)
	}
	switch {
	case (until == "") == (lasting == 0):
		return e.usageError(fmt.Errorf("give one of --until TIME and --for DURATION\nusage: sluice ctl %s", synopsis))
	case until != "":
		if req.ExpiresAt, err = time.Parse(time.RFC3339, until); err != nil {
			return e.usageError(fmt.Errorf("--until %q: want an RFC 3339 time, like 2026-12-04T17:00:00Z", until))
		}
	default:
		req.ExpiresAt = time.Now().Add(lasting).UTC().Truncate(time.Second)
		until = req.ExpiresAt.Format(time.RFC3339)
	}
	if strings.TrimSpace(message) == "" {
		return e.usageError(fmt.Errorf("-m MSG is required\nusage: sluice ctl %s", synopsis))
	}
	if err := e.connect(); err != nil {
		return e.fail(err, nil)
	}
	out, change, err := e.client.CreateOverride(ctx, req)
	if err != nil {
		return e.fail(err, nil)
	}
	if change != nil {
		if e.jsonOut() {
			return e.printJSON(consoleapi.Proposed{Change: *change})
		}
		fmt.Fprintf(e.stdout, "approval required: proposed change request %d (the override is published when it is approved; --urgent publishes at once)\n", change.ID)
		return nil
	}
	if e.jsonOut() {
		return e.printJSON(out)
	}
	fmt.Fprintf(e.stdout, "created override %d in version %d, until %s\n", out.ID, out.Version, until)
	return nil
}

func overridesEnd(ctx context.Context, e *env, args []string) error {
	var message string
	fs := e.flags("overrides end")
	fs.StringVar(&message, "m", "", "why it ends early (required)")
	const synopsis = "overrides end ID -m MSG"
	args, err := e.parse(fs, args, 1, synopsis)
	if err != nil {
		return err
	}
	if strings.TrimSpace(message) == "" {
		return e.usageError(fmt.Errorf("-m MSG is required\nusage: sluice ctl %s", synopsis))
	}
	id, err := strconv.ParseInt(args[0], 10, 64)
	if err != nil || id <= 0 {
		return e.usageError(fmt.Errorf("override id %q: want a positive integer", args[0]))
	}
	if err := e.connect(); err != nil {
		return e.fail(err, nil)
	}
	pub, err := e.client.EndOverride(ctx, id, message)
	if err != nil {
		return e.fail(err, nil)
	}
	if e.jsonOut() {
		return e.printJSON(pub)
	}
	fmt.Fprintf(e.stdout, "ended override %d in version %d\n", id, pub.Version)
	return nil
}
