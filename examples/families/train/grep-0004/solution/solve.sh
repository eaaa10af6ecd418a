#!/bin/bash
grep error records.txt > total.txt
