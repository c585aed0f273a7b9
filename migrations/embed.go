// Package migrations holds Sluice's Postgres schema as numbered goose SQL
// files, embedded in the binary. They are forward-only and never edited once
// they have landed.
package migrations

import "embed"

// FS holds the migration files.
//
//go:embed *.sql
var FS embed.FS
