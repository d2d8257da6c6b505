"""A migration operation for the jobs tables, which take writes all the time: an index built with
CREATE INDEX CONCURRENTLY on PostgreSQL (the migration must be `atomic = False`), a plain
CREATE INDEX elsewhere. Its module name starts with "_", so Django loads it as no migration."""

from django.db import migrations


class AddIndexConcurrentlyOnPostgres(migrations.AddIndex):
    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.add_index(model, self.index, concurrently=True)
        else:
            schema_editor.add_index(model, self.index)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        model = from_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.remove_index(model, self.index, concurrently=True)
        else:
            schema_editor.remove_index(model, self.index)


class RemoveIndexConcurrentlyOnPostgres(migrations.RemoveIndex):
    """DROP INDEX CONCURRENTLY on PostgreSQL (no lock that stops writes), a plain DROP elsewhere."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = from_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        index = from_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.remove_index(model, index, concurrently=True)
        else:
            schema_editor.remove_index(model, index)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        index = to_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.add_index(model, index, concurrently=True)
        else:
            schema_editor.add_index(model, index)
