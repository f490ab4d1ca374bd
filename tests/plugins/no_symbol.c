/* Test plugin: a shared object that does not export fsdp_stage_register. */
int fsdp_something_else(void);
int fsdp_something_else(void) { return 42; }
