package ctl

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/internal/consoleapi"
)

// The support desk: "inspect DOMAIN key=value..." and "reset DOMAIN
// key=value... -m MSG". The pairs after DOMAIN are one request descriptor,
// in order; a lone "+" starts the next one, so a request of two
// descriptors reads
//
//	sluice ctl inspect api customer=c1 + customer=c1 route=/search

// Inspect returns the limits ds match in domain, with their counters.
func (c *Client) Inspect(ctx context.Context, domain string, ds []consoleapi.RequestDescriptor) (consoleapi.Inspection, error) {
	var out consoleapi.Inspection
	_, err := c.call(ctx, "POST", "/api/v1/inspect", consoleapi.InspectRequest{Domain: domain, Descriptors: ds}, &out)
	return out, err
}

// Reset starts the counters of the limits ds match in domain afresh.
func (c *Client) Reset(ctx context.Context, domain string, ds []consoleapi.RequestDescriptor, message string) (consoleapi.ResetResult, error) {
	var out consoleapi.ResetResult
	_, err := c.call(ctx, "POST", "/api/v1/inspect/reset", consoleapi.ResetRequest{Domain: domain, Descriptors: ds, Message: message}, &out)
	return out, err
}

// parseDescriptors reads key=value arguments, "+" separating descriptors.
func parseDescriptors(args []string) ([]consoleapi.RequestDescriptor, error) {
	var ds []consoleapi.RequestDescriptor
	var cur consoleapi.RequestDescriptor
	end := func() error {
		if len(cur.Entries) == 0 {
			return errors.New(`each descriptor needs at least one key=value (a "+" separates descriptors)`)
		}
		ds = append(ds, cur)
		cur = consoleapi.RequestDescriptor{}
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
		cur.Entries = append(cur.Entries, consoleapi.Entry{Key: k, Value: v})
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
		rows[i] = []string{strconv.Itoa(l.Descriptor), cell(l.Rule), string(l.Algorithm), limit, used, remaining, resets, cell(strings.Join(notes, ", "))}
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
