// Generates src/schema.d.ts from the broker's OpenAPI schema with openapi-typescript, or with
// --check regenerates into a temporary file and fails when it differs from the committed one.
// The schema is ../../docs/openapi.json (the repository's committed schema) unless
// OPENAPI_SCHEMA names another file.
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const schema = resolve(root, process.env.OPENAPI_SCHEMA ?? "../../docs/openapi.json");
const committed = join(root, "src", "schema.d.ts");
const cli = join(root, "node_modules", ".bin", "openapi-typescript");
const check = process.argv.includes("--check");

function generate(output) {
  execFileSync(cli, [schema, "--output", output], {
    cwd: root,
    stdio: ["ignore", "ignore", "inherit"],
  });
}

if (!existsSync(schema)) {
  console.error(`No OpenAPI schema at ${schema} (set OPENAPI_SCHEMA to use another file).`);
  process.exit(1);
}

if (!check) {
  generate(committed);
  console.log(`src/schema.d.ts generated from ${schema}`);
} else {
  const scratch = mkdtempSync(join(tmpdir(), "schema-check-"));
  try {
    const fresh = join(scratch, "schema.d.ts");
    generate(fresh);
    if (readFileSync(fresh, "utf8") !== readFileSync(committed, "utf8")) {
      console.error(
        `src/schema.d.ts differs from what ${schema} generates: run \`npm run generate\` and commit it.`,
      );
      process.exit(1);
    }
    console.log(`src/schema.d.ts matches ${schema}`);
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
}
