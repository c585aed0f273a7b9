package ctl

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The support desk: "inspect DOMAIN key=value..." and "reset DOMAIN
// key=value... -m MSG". The pairs after DOMAIN are one request descriptor,
// in order; a lone "+" starts the next one, so a request of two
// descriptors reads
//
//	sluice ctl inspect api customer=c1 + customer=c1 route=/search

// Descriptor is one request descriptor: ordered entries.
type Descriptor struct {
	Entries []Entry `json:"entries"`
}

// Entry is one key and value of a descriptor.
type Entry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// InspectedLimit is one limit an inspected descriptor matches, with its
// counter.
type InspectedLimit struct {
	Descriptor      int       `json:"descriptor"`
	Rule            string    `json:"rule"`
	Algorithm       string    `json:"algorithm"`
	RequestsPerUnit int64     `json:"requests_per_unit"`
	Unit            string    `json:"unit"`
	Used            int64     `json:"used"`
	Remaining       int64     `json:"remaining"`
	ResetAt         time.Time `json:"reset_at"`
	Capacity        int64     `json:"capacity"`
	ShadowMode      bool      `json:"shadow_mode"`
	Unlimited       bool      `json:"unlimited"`
	Shards          int       `json:"shards"`
}

// Inspection is the answer of POST /api/v1/inspect.
type Inspection struct {
	Version int64            `json:"version"`
	Limits  []InspectedLimit `json:"limits"`
}

// ResetResult is the answer of POST /api/v1/inspect/reset.
type ResetResult struct {
	Version int64 `json:"version"`
	Limits  []struct {
		Descriptor int    `json:"descriptor"`
		Rule       string `json:"rule"`
	} `json:"limits"`
	Keys int64 `json:"keys"`
}

// Inspect returns the limits ds match in domain, with their counters.
func (c *Client) Inspect(ctx context.Context, domain string, ds []Descriptor) (Inspection, error) {
	var out Inspection
	_, err := c.call(ctx, "POST", "/api/v1/inspect", map[string]any{"domain": domain, "descriptors": ds}, &out)
	return out, err
}

// Reset starts the counters of the limits ds match in domain afresh.
func (c *Client) Reset(ctx context.Context, domain string, ds []Descriptor, message string) (ResetResult, error) {
	var out ResetResult
	_, err := c.call(ctx, "POST", "/api/v1/inspect/reset", map[string]any{"domain": domain, "descriptors": ds, "message": message}, &out)
	return out, err
}

// parseDescriptors reads key=value arguments, "+" separating descriptors.
func parseDescriptors(args []string) ([]Descriptor, error) {
	var ds []Descriptor
	cur := Descriptor{}
	end := func() error {
		if len(cur.Entries) == 0 {
			return errors.New(`each descriptor needs at least one key=value (a "+" separates descriptors)`)
		}
		ds = append(ds, cur)
		cur = Descriptor{}
		return nil
	}
	for _, a := range args {
		if a == "+" {
			if err := end(); err != nil {
				return nil, err
			}
			continue
		}
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q: want key=value", a)
		}
		cur.Entries = append(cur.Entries, Entry{Key: k, Value: v})
	}
	if err := end(); err != nil {
		return nil, err
	}
	return ds, nil
}

func inspect(ctx context.Context, e *env, args []string) error {
	fs := e.flags("inspect")
	const synopsis = "inspect DOMAIN key=value... [+ key=value...]"
	args, err := e.parse(fs, args, -2, synopsis)
	if err != nil {
		return err
	}
	ds, err := parseDescriptors(args[1:])
	if err != nil {
		return e.usageError(fmt.Errorf("%w\nusage: sluice ctl %s", err, synopsis))
	}
	if err := e.connect(); err != nil {
		return e.fail(err, nil)
	}
	ins, err := e.client.Inspect(ctx, args[0], ds)
	if err != nil {
		return e.fail(err, nil)
	}
	if e.jsonOut() {
		return e.printJSON(ins)
	}
	if len(ins.Limits) == 0 {
		fmt.Fprintf(e.stdout, "no limit of domain %s (version %d) matches\n", args[0], ins.Version)
		return nil
	}
	rows := make([][]string, len(ins.Limits))
	for i, l := range ins.Limits {
		limit, used, remaining, resets := "unlimited", "-", "-", "-"
		if !l.Unlimited {
			limit = fmt.Sprintf("%d/%s", l.RequestsPerUnit, l.Unit)
			used = fmt.Sprintf("%d/%d", l.Used, l.Capacity)
			remaining = strconv.FormatInt(l.Remaining, 10)
			resets = when(l.ResetAt)
		}
		var notes []string
		if l.ShadowMode {
			notes = append(notes, "shadow mode")
		}
		if l.Shards > 1 {
			notes = append(notes, fmt.Sprintf("%d shards", l.Shards))
		}
		rows[i] = []string{strconv.Itoa(l.Descriptor), cell(l.Rule), l.Algorithm, limit, used, remaining, resets, cell(strings.Join(notes, ", "))}
	}
	fmt.Fprintf(e.stdout, "domain %s, version %d\n", args[0], ins.Version)
	return e.table([]string{"DESCRIPTOR", "RULE", "ALGORITHM", "LIMIT", "USED", "REMAINING", "RESETS", "NOTE"}, rows)
}

func reset(ctx context.Context, e *env, args []string) error {
	var message string
	fs := e.flags("reset")
	fs.StringVar(&message, "m", "", "why (required; audited)")
	const synopsis = "reset DOMAIN key=value... [+ key=value...] -m MSG"
	args, err := e.parse(fs, args, -2, synopsis)
	if err != nil {
		return err
	}
	if strings.TrimSpace(message) == "" {
		return e.usageError(fmt.Errorf("-m MSG is required\nusage: sluice ctl %s", synopsis))
	}
	ds, err := parseDescriptors(args[1:])
	if err != nil {
		return e.usageError(fmt.Errorf("%w\nusage: sluice ctl %s", err, synopsis))
	}
	if err := e.connect(); err != nil {
		return e.fail(err, nil)
	}
	res, err := e.client.Reset(ctx, args[0], ds, message)
	if err != nil {
		return e.fail(err, nil)
	}
	if e.jsonOut() {
		return e.printJSON(res)
	}
	names := make([]string, len(res.Limits))
	for i, l := range res.Limits {
		names[i] = l.Rule
	}
	fmt.Fprintf(e.stdout, "reset %d limits of domain %s (version %d): %s\n", len(res.Limits), args[0], res.Version, strings.Join(names, ", "))
	return nil
}
