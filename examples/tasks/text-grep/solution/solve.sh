#!/bin/bash
grep error log.txt > errors.txt
