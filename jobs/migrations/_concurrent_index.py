"""A migration operation for the jobs tables, which take writes all the time: an index built with
CREATE INDEX CONCURRENTLY on PostgreSQL (the migration must be `atomic = False`), a plain
CREATE INDEX elsewhere. Its module name starts with "_", so Django loads it as no migration."""

from django.db import migrations


class AddIndexConcurrentlyOnPostgres(migrations.AddIndex):
    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            _concurrently_on_postgres(schema_editor.add_index, model, self.index)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            _concurrently_on_postgres(schema_editor.remove_index, model, self.index)


class RemoveIndexConcurrentlyOnPostgres(migrations.RemoveIndex):
    """DROP INDEX CONCURRENTLY on PostgreSQL (no lock that stops writes), a plain DROP elsewhere."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            index = from_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
            _concurrently_on_postgres(schema_editor.remove_index, model, index)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            index = to_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
            _concurrently_on_postgres(schema_editor.add_index, model, index)


def _concurrently_on_postgres(change, model, index):
    """`change` (the schema editor's add_index or remove_index), CONCURRENTLY on PostgreSQL: only
    PostgreSQL's schema editor takes the argument."""
    if change.__self__.connection.vendor == "postgresql":
        change(model, index, concurrently=True)
    else:
        change(model, index)
